package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// Sources are where the checker reads the ledger's state.
type Sources struct {
	Pool *pgxpool.Pool
	JS   jetstream.JetStream
	// Prefix is the subject prefix; default "ledger".
	Prefix string
	// Downstream is the run's downstream database, whose applied side
	// effects are checked; nil checks none.
	Downstream *pgxpool.Pool
}

// readTimeout bounds the collector's reads: the rows, LEDGER_LOG and
// LEDGER_DLQ of a whole run. An hour-long run holds millions of messages;
// 30 s was too short for one on a loaded machine, which then ended
// without a verdict.
const readTimeout = 15 * time.Minute

// ReadLogs reads every writer log (*.jsonl) in dir.
func ReadLogs(dir string) ([]*WriterLog, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("chaos: no writer logs (*.jsonl) in %s", dir)
	}
	sort.Strings(names)
	var out []*WriterLog
	for _, name := range names {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("chaos: open writer log: %w", err)
		}
		wl, err := ReadLog(filepath.Base(name), f)
		f.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, wl)
	}
	return out, nil
}

// Collect reads what the ledger holds about the writers' tasks and
// partitions.
func Collect(ctx context.Context, src Sources, writers []*WriterLog) (*History, error) {
	h := &History{Writers: writers, Projections: map[string][]byte{}}
	var tasks []string
	var parts []int32
	for _, w := range writers {
		tasks = append(tasks, w.Tasks...)
		parts = append(parts, int32(w.Partition))
	}
	slices.Sort(tasks)
	tasks = slices.Compact(tasks)
	slices.Sort(parts)
	parts = slices.Compact(parts)
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	if err := collectRows(ctx, src.Pool, h, tasks, parts); err != nil {
		return nil, err
	}
	subj := wire.Subjects{Prefix: src.Prefix}
	want := map[string]bool{}
	for _, t := range tasks {
		want[t] = true
	}
	var logFilters, dlqFilters []string
	for _, p := range parts {
		logFilters = append(logFilters, subj.LogPartition(int(p)))
		dlqFilters = append(dlqFilters, subj.DLQ(int(p), "*"))
	}
	err := readStream(ctx, src.JS, wire.StreamLog, logFilters, func(m jetstream.Msg, seq uint64) {
		for _, c := range parseCopies(subj, seq, m.Subject(), m.Headers(), m.Data()) {
			// A copy the codec refuses is kept if its subject names one of
			// the run's tasks, or if it is a log batch, which names none.
			if want[c.Task] || c.Err != "" && (want[lastToken(m.Subject())] || subj.IsLogBatch(m.Subject())) {
				h.Log = append(h.Log, c)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	err = readStream(ctx, src.JS, wire.StreamDLQ, dlqFilters, func(m jetstream.Msg, seq uint64) {
		if l := parseLetter(subj, seq, m.Subject(), m.Headers(), m.Data()); want[l.Task] {
			h.DLQ = append(h.DLQ, l)
		}
	})
	if err != nil {
		return nil, err
	}
	kv, err := src.JS.KeyValue(ctx, wire.BucketTasks)
	if err != nil {
		return nil, fmt.Errorf("chaos: open bucket %s: %w", wire.BucketTasks, err)
	}
	for _, t := range tasks {
		e, err := kv.Get(ctx, t)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, fmt.Errorf("chaos: read %s/%s: %w", wire.BucketTasks, t, err)
		default:
			h.Projections[t] = e.Value()
		}
	}
	if src.Downstream != nil {
		if err := collectEffects(ctx, src.Downstream, h); err != nil {
			return nil, err
		}
	}
	return h, nil
}

func lastToken(subject string) string {
	for i := len(subject) - 1; i >= 0; i-- {
		if subject[i] == '.' {
			return subject[i+1:]
		}
	}
	return subject
}

func collectRows(ctx context.Context, pool *pgxpool.Pool, h *History, tasks []string, parts []int32) error {
	rows, _ := pool.Query(ctx, sqlEvents, tasks)
	var e EventRow
	var payload string
	_, err := pgx.ForEachRow(rows, []any{&e.Seq, &e.EventID, &e.Partition, &e.Task, &e.Version, &e.Type, &payload,
		&e.Holder, &e.Generation, &e.CommittedAt, &e.WouldReject}, func() error {
		e.Payload = []byte(payload)
		h.Events = append(h.Events, e)
		return nil
	})
	if err != nil {
		return fmt.Errorf("chaos: read ledger.events: %w", err)
	}
	rows, _ = pool.Query(ctx, sqlObserving, parts)
	var p int
	_, err = pgx.ForEachRow(rows, []any{&p}, func() error {
		if h.Observing == nil {
			h.Observing = map[int]bool{}
		}
		h.Observing[p] = true
		return nil
	})
	if err != nil {
		return fmt.Errorf("chaos: read ledger.fence_modes: %w", err)
	}
	rows, _ = pool.Query(ctx, sqlRejections, tasks)
	var r RejectionRow
	_, err = pgx.ForEachRow(rows, []any{&r.EventID, &r.Partition, &r.Task, &r.Version, &r.Holder, &r.Generation,
		&r.Verdict, &r.Reason, &r.CurrentGeneration, &r.RejectedAt}, func() error {
		h.Rejections = append(h.Rejections, r)
		return nil
	})
	if err != nil {
		return fmt.Errorf("chaos: read ledger.rejections: %w", err)
	}
	rows, _ = pool.Query(ctx, sqlGrants, parts)
	var g GrantRow
	_, err = pgx.ForEachRow(rows, []any{&g.Partition, &g.Generation, &g.Holder, &g.GrantedAt}, func() error {
		h.Grants = append(h.Grants, g)
		return nil
	})
	if err != nil {
		return fmt.Errorf("chaos: read ledger.lease_grants: %w", err)
	}
	return nil
}

// readStream reads every message of stream on filters, in stream order,
// with an ordered consumer: nothing is acked or consumed.
func readStream(ctx context.Context, js jetstream.JetStream, stream string, filters []string,
	fn func(m jetstream.Msg, streamSeq uint64)) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("chaos: open stream %s: %w", stream, err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: filters,
		DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return fmt.Errorf("chaos: read %s: %w", stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("chaos: read %s: %w", stream, err)
	}
	defer it.Stop()
	if info := cons.CachedInfo(); info == nil || info.NumPending == 0 {
		return nil
	}
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("chaos: read %s: %w", stream, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("chaos: read %s: %w", stream, err)
		}
		fn(m, meta.Sequence.Stream)
		if meta.NumPending == 0 {
			return nil
		}
	}
}
