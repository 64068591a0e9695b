package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/internal/logscan"
	"github.com/flowness/ledger/pkg/fence"
	projstate "github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// What verify checks, and repair puts back: the kinds of -kinds.
const (
	kindProjection = "projection"
	kindLog        = "log"
	kindConsumer   = "consumer"
)

var allKinds = []string{kindProjection, kindLog, kindConsumer}

// verifyRowsMax bounds the commits the LEDGER_LOG check reads.
const verifyRowsMax = 1_000_000

// finding is one thing JetStream lost or holds inconsistently, against
// PostgreSQL or against its own stream.
type finding struct {
	Kind      string `json:"kind"`
	Problem   string `json:"problem"`
	Task      string `json:"task,omitempty"`
	Partition int    `json:"partition"`
	Stream    string `json:"stream,omitempty"`
	Consumer  string `json:"consumer,omitempty"`
	// Have is what JetStream holds: the projection's version, the last
	// LEDGER_LOG copy's version, the consumer's ack floor.
	Have int64 `json:"have"`
	// Want is what it should hold at least: the task's head version, or
	// for a consumer the stream's last sequence or first pending message.
	Want int64 `json:"want"`
}

// verifyOpts are the checks' bounds.
type verifyOpts struct {
	kinds []string
	since time.Duration // the LEDGER_LOG check's window
	grace time.Duration // heads younger than this are passed over
}

func (o verifyOpts) has(kind string) bool { return slices.Contains(o.kinds, kind) }

// verifyDeps is what the checks read.
type verifyDeps struct {
	pool  *pgxpool.Pool
	store *fence.Store
	js    jetstream.JetStream
	subj  wire.Subjects
}

// Verify reports what JetStream lost or holds inconsistently against
// PostgreSQL ("verify"); read-only.
func Verify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, opts := verifyFlags("ledgerctl verify",
		"Check JetStream against PostgreSQL, read-only, and report per kind what is missing:\n"+
			"  projection  a task's value in ledger_tasks below its head in ledger.heads, or missing\n"+
			"  log         a task committed within -since whose newest version has no LEDGER_LOG copy\n"+
			"  consumer    a LEDGER_IN or LEDGER_LOG consumer whose position is past its stream\n"+
			"Exits 1 when anything is found. 'ledgerctl repair' puts back the first two kinds.", stderr)
	_, done, found, err := startVerify(ctx, f, opts, args)
	if err != nil {
		return err
	}
	defer done()
	if err := printFindings(stdout, f.JSON, found); err != nil {
		return err
	}
	if len(found) > 0 {
		return fmt.Errorf("%d found", len(found))
	}
	return nil
}

// verifyFlags are the flags verify and repair share.
func verifyFlags(name, help string, stderr io.Writer) (*Flags, *verifyOpts) {
	f := NewFlags(name, "[-kinds LIST] [-since D] [-grace D]", help, stderr)
	opts := &verifyOpts{}
	kinds := (*listFlag)(&opts.kinds)
	f.Var(kinds, "kinds", "kinds to check: projection, log, consumer (default all)")
	f.DurationVar(&opts.since, "since", 24*time.Hour, "the log check looks at tasks committed within this window")
	f.DurationVar(&opts.grace, "grace", 30*time.Second, "pass over heads committed less than this ago: their copy may be on its way")
	return f, opts
}

func (o *verifyOpts) check() error {
	if len(o.kinds) == 0 {
		o.kinds = allKinds
	}
	for _, k := range o.kinds {
		if !slices.Contains(allKinds, k) {
			return Usagef("-kinds: unknown kind %q (want %s)", k, strings.Join(allKinds, ", "))
		}
	}
	if o.since <= 0 || o.grace < 0 {
		return Usagef("-since must be positive and -grace not negative")
	}
	return nil
}

// startVerify parses verify's and repair's arguments, opens what they
// read, and runs the checks: what both commands begin with.
func startVerify(ctx context.Context, f *Flags, opts *verifyOpts, args []string) (*verifyDeps, func(), []finding, error) {
	if err := f.Parse(args); err != nil {
		return nil, nil, nil, err
	}
	if f.NArg() > 0 {
		return nil, nil, nil, Usagef("unexpected argument %q", f.Arg(0))
	}
	if err := opts.check(); err != nil {
		return nil, nil, nil, err
	}
	d, done, err := openVerify(ctx, f)
	if err != nil {
		return nil, nil, nil, err
	}
	found, err := d.verify(ctx, *opts)
	if err != nil {
		done()
		return nil, nil, nil, err
	}
	return d, done, found, nil
}

func openVerify(ctx context.Context, f *Flags) (*verifyDeps, func(), error) {
	pool, err := f.Postgres(ctx)
	if err != nil {
		return nil, nil, err
	}
	store, err := fence.New(pool, fence.Config{})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	nc, js, err := f.JetStream()
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	d := &verifyDeps{pool: pool, store: store, js: js, subj: wire.Subjects{Prefix: f.Prefix}}
	return d, func() { nc.Close(); pool.Close() }, nil
}

// verify runs the checks opts asks for.
func (d *verifyDeps) verify(ctx context.Context, opts verifyOpts) ([]finding, error) {
	var out []finding
	for _, c := range []struct {
		kind  string
		check func(context.Context, verifyOpts) ([]finding, error)
	}{{kindProjection, d.projections}, {kindLog, d.logTail}, {kindConsumer, d.consumers}} {
		if !opts.has(c.kind) {
			continue
		}
		found, err := c.check(ctx, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, found...)
	}
	return out, nil
}

// sqlSettledHeads reads the task heads committed more than $1 seconds ago.
const sqlSettledHeads = `
SELECT h.task_id, h.partition, h.version
FROM ledger.heads h
WHERE coalesce((SELECT e.committed_at < now() - make_interval(secs => $1) FROM ledger.events e WHERE e.seq = h.seq), true)
ORDER BY h.task_id`

// projections finds the settled heads whose bucket value is below them,
// missing, or not a projection of the task. A value waiting for a missing
// version is the projector's to re-fetch, and is passed over.
func (d *verifyDeps) projections(ctx context.Context, opts verifyOpts) ([]finding, error) {
	kv, err := d.js.KeyValue(ctx, wire.BucketTasks)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", wire.BucketTasks, err)
	}
	rows, err := d.pool.Query(ctx, sqlSettledHeads, opts.grace.Seconds())
	if err != nil {
		return nil, schemaHint("read the task heads", err)
	}
	heads, err := pgx.CollectRows(rows, pgx.RowToStructByPos[fence.TaskHead])
	if err != nil {
		return nil, schemaHint("read the task heads", err)
	}
	var out []finding
	for _, h := range heads {
		f := finding{Kind: kindProjection, Task: h.Task, Partition: h.Partition, Want: h.Version}
		entry, err := kv.Get(ctx, h.Task)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			f.Problem = "missing"
		case err != nil:
			return nil, fmt.Errorf("read the projection of %s: %w", h.Task, err)
		default:
			var st projstate.State
			if err := json.Unmarshal(entry.Value(), &st); err != nil || st.Task != h.Task {
				f.Problem = "not_a_projection"
			} else if st.Gap == nil && st.Version < h.Version {
				f.Problem, f.Have = "behind", st.Version
			}
		}
		if f.Problem != "" {
			out = append(out, f)
		}
	}
	return out, nil
}

// logTail finds the tasks committed within opts.since whose last LEDGER_LOG
// copy is older than their newest commit, as the ingest's tail check does
// (internal/ingest/logtail.go) over its shorter window.
func (d *verifyDeps) logTail(ctx context.Context, opts verifyOpts) ([]finding, error) {
	s, err := stream(ctx, d.js, wire.StreamLog)
	if err != nil {
		return nil, err
	}
	heads, err := d.store.RecentHeads(ctx, opts.since, verifyRowsMax)
	if err != nil {
		return nil, schemaHint("read the recent task heads", err)
	}
	batched, err := logscan.BatchedVersions(ctx, d.js.Conn(), d.subj, opts.since, RequestTimeout)
	if err != nil {
		return nil, err
	}
	var out []finding
	for _, h := range heads {
		have, err := logscan.LastCopied(ctx, s, d.subj, h.Partition, h.Task)
		if err != nil {
			return nil, err
		}
		have = max(have, batched[h.Task])
		if have < h.Version {
			out = append(out, finding{Kind: kindLog, Problem: "copies_missing", Task: h.Task, Partition: h.Partition,
				Stream: wire.StreamLog, Have: have, Want: h.Version})
		}
	}
	slices.SortFunc(out, func(a, b finding) int { return strings.Compare(a.Task, b.Task) })
	return out, nil
}

// consumers finds the consumers of the inboxes and LEDGER_LOG whose position
// is past their stream's last sequence (the stream lost its tail, and new
// messages would get sequences counted as delivered), and the LEDGER_IN
// consumers with a message at or below their ack floor (a work queue keeps
// only messages not yet acked: that one is never delivered).
func (d *verifyDeps) consumers(ctx context.Context, _ verifyOpts) ([]finding, error) {
	var out []finding
	for _, name := range append(inboxes(ctx, d.js, d.subj.Prefix), wire.StreamLog) {
		s, err := stream(ctx, d.js, name)
		if err != nil {
			return nil, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		list := s.ListConsumers(ctx)
		for ci := range list.Info() {
			f := finding{Kind: kindConsumer, Stream: name, Consumer: ci.Name, Partition: -1, Have: int64(ci.AckFloor.Stream)}
			last := info.State.LastSeq
			switch {
			case ci.AckFloor.Stream > last || ci.Delivered.Stream > last:
				f.Problem, f.Have, f.Want = "ahead_of_stream", int64(max(ci.AckFloor.Stream, ci.Delivered.Stream)), int64(last)
			case isInbox(name) && ci.AckFloor.Stream > 0:
				first, err := firstMsg(ctx, s, ci.Config)
				if err != nil {
					return nil, fmt.Errorf("consumer %s: %w", ci.Name, err)
				}
				if first > 0 && first <= ci.AckFloor.Stream {
					f.Problem, f.Want = "message_below_ack_floor", int64(first)
				}
			}
			if f.Problem != "" {
				out = append(out, f)
			}
		}
		if err := list.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
			return nil, fmt.Errorf("consumers of %s: %w", name, err)
		}
	}
	return out, nil
}

// firstMsg is the sequence of the first message of a consumer's filter; 0
// if there is none.
func firstMsg(ctx context.Context, s jetstream.Stream, cfg jetstream.ConsumerConfig) (uint64, error) {
	filters := cfg.FilterSubjects
	if cfg.FilterSubject != "" {
		filters = append(filters, cfg.FilterSubject)
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	var first uint64
	for _, subj := range filters {
		m, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if first == 0 || m.Sequence < first {
			first = m.Sequence
		}
	}
	return first, nil
}

func printFindings(w io.Writer, asJSON bool, found []finding) error {
	if asJSON {
		return writeJSONLines(w, found)
	}
	if len(found) == 0 {
		fmt.Fprintln(w, "JetStream holds what PostgreSQL says it should: nothing found")
		return nil
	}
	t := newTable(w, "KIND", "PROBLEM", "TASK/CONSUMER", "PARTITION", "HAVE", "WANT")
	for _, f := range found {
		who, part := f.Task, fmt.Sprint(f.Partition)
		if f.Kind == kindConsumer {
			who, part = f.Stream+"/"+f.Consumer, "-"
		}
		t.row(f.Kind, f.Problem, who, part, f.Have, f.Want)
	}
	return t.flush()
}
