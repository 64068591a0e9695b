package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// Reconciliation finds projections behind their task's head and folds what
// they miss from PostgreSQL. The log and the bucket live in JetStream, which
// can lose its newest writes (a power loss within sync_interval, a corrupt
// block): a lost log copy or a lost bucket value leaves a projection behind
// with nothing to notice it until the task's next version, and a finished
// task never gets one.
//
// Every ReconcileEvery the loop reads a page of ledger.heads in its
// partitions, in task order, and compares each head with the projection (the
// engine's state if resident, else the bucket value). A head committed less
// than ReconcileGrace ago is passed over: its copy may still be on its way.
// The pages go round the whole table and start again.

// headRow is one task head of a reconciliation page.
type headRow struct {
	task    string
	version int64
	settled bool // committed more than ReconcileGrace ago
}

// reconciler is where the sweep of ledger.heads stands.
type reconciler struct {
	after string // the last task of the previous page; "" starts again
}

// sqlHeadsPage reads a page of heads of the partitions $1 after task $2,
// each with whether it was committed more than $3 seconds ago.
const sqlHeadsPage = `
SELECT h.task_id, h.version,
       coalesce((SELECT e.committed_at < now() - make_interval(secs => $3) FROM ledger.events e WHERE e.seq = h.seq), true)
FROM ledger.heads h
WHERE h.partition = ANY($1::int[]) AND h.task_id > $2
ORDER BY h.task_id LIMIT $4`

// reconcileTurn checks one page of heads and stores what it folded again.
func (s *Service) reconcileTurn(ctx context.Context) {
	changed := map[string]projection.State{}
	s.reconcile(ctx, changed)
	s.writeAll(ctx, changed)
}

// reconcile compares a page of heads with their projections and offers,
// for each projection behind, the versions it misses.
func (s *Service) reconcile(ctx context.Context, changed map[string]projection.State) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	heads, err := s.headsPage(ctx)
	if err != nil {
		s.log.Warn("reconciliation: reading the task heads failed; it tries again", slog.String("error", err.Error()))
		return
	}
	behind := s.behind(ctx, heads)
	for _, h := range behind {
		from, err := s.reconcileFrom(ctx, h.task, changed)
		if err != nil {
			s.log.Warn("reconciliation: loading a projection failed; it tries again", slog.String("task", h.task),
				slog.String("error", err.Error()))
			continue
		}
		events, err := s.queryEvents(ctx, []string{h.task}, []int64{from + 1}, []int64{h.version})
		if err != nil {
			s.log.Warn("reconciliation: reading events failed; it tries again", slog.String("task", h.task),
				slog.String("error", err.Error()))
			continue
		}
		s.log.Warn("projection behind its task's head; folding the missing versions from PostgreSQL",
			slog.String("task", h.task), slog.Int64("projected_version", from), slog.Int64("head_version", h.version))
		for _, ev := range events {
			_ = s.offer(ctx, ev, changed, nil) // resident: loaded by reconcileFrom
		}
		s.metrics.reconciled.Inc()
	}
}

// headsPage reads the next page of heads and moves the sweep on.
func (s *Service) headsPage(ctx context.Context) ([]headRow, error) {
	rows, err := s.pool.Query(ctx, sqlHeadsPage, s.cfg.partitionsOrAll(), s.recon.after,
		s.cfg.ReconcileGrace.Seconds(), s.cfg.ReconcilePage)
	if err != nil {
		return nil, err
	}
	heads, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (headRow, error) {
		var h headRow
		return h, r.Scan(&h.task, &h.version, &h.settled)
	})
	if err != nil {
		return nil, err
	}
	if len(heads) < s.cfg.ReconcilePage {
		s.recon.after = ""
	} else {
		s.recon.after = heads[len(heads)-1].task
	}
	return heads, nil
}

// behind picks the settled heads whose bucket value is below them. The
// bucket is read even for a task the engine holds: the value the engine
// wrote may be the one the server lost. A task that waits for a missing
// version, or that is held, is left alone: it is on its way already.
func (s *Service) behind(ctx context.Context, heads []headRow) []headRow {
	var check []headRow
	for _, h := range heads {
		if !h.settled || s.held[h.task] != nil {
			continue
		}
		if st, resident := s.engine.State(h.task); resident && st.Gap != nil {
			continue
		}
		check = append(check, h)
	}
	if len(check) == 0 {
		return nil
	}
	events := make([]projection.Event, len(check))
	for i, h := range check {
		events[i].Task = h.task
	}
	read := s.readValues(ctx, events)
	var out []headRow
	for _, h := range check {
		entry, err := read.take(h.task)
		if entry == nil && err == nil {
			entry, err = s.kv.Get(ctx, h.task)
		}
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			out = append(out, h)
		case err != nil:
			continue // read again on the next round
		default:
			st, err := storedState(h.task, entry.Value())
			if err != nil || (st.Gap == nil && st.Version < h.version) {
				out = append(out, h) // load refolds a value that is not a projection
			}
		}
	}
	return out
}

// reconcileFrom loads a task from its bucket value and returns the version
// it holds.
// A value that was not a projection of its task comes back folded again,
// and goes into changed to be written over.
func (s *Service) reconcileFrom(ctx context.Context, task string, changed map[string]projection.State) (int64, error) {
	// A resident task is loaded again from what the bucket holds now, at
	// its current revision: the engine's state is not in the bucket.
	if s.engine.Evict(task) {
		delete(s.revs, task)
	}
	if _, resident := s.engine.State(task); !resident {
		rewrite, err := s.load(ctx, task, nil)
		if err != nil {
			return 0, err
		}
		if rewrite {
			changed[task], _ = s.engine.State(task)
		}
	}
	st, _ := s.engine.State(task)
	return st.Version, nil
}

// reconcileTicker is the reconciliation's timer: nil (never fires) when it
// is off.
func (s *Service) reconcileTicker() (<-chan time.Time, func()) {
	if s.cfg.ReconcileEvery <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(s.cfg.ReconcileEvery)
	return t.C, t.Stop
}

// RepairTasks folds again from PostgreSQL the projections of the tasks of
// heads, each up to its head's version, and stores them: what `ledgerctl
// repair` runs for the projections `ledgerctl verify` found behind. It
// takes the reconciliation's steps, without Start. A projector may run
// meanwhile: each write is a compare-and-set on the revision read, and a
// lost one is read again. The buckets must exist; RepairTasks creates
// nothing.
func (s *Service) RepairTasks(ctx context.Context, heads map[string]int64) error {
	if err := s.bind(ctx); err != nil {
		return err
	}
	changed := map[string]projection.State{}
	for task, head := range heads {
		from, err := s.reconcileFrom(ctx, task, changed)
		if err != nil {
			return fmt.Errorf("projector: repair %s: %w", task, err)
		}
		for from < head {
			events, err := s.queryEvents(ctx, []string{task}, []int64{from + 1}, []int64{head})
			if err != nil {
				return fmt.Errorf("projector: repair %s: %w", task, err)
			}
			for _, ev := range events {
				if err := s.offer(ctx, ev, changed, nil); err != nil {
					return fmt.Errorf("projector: repair %s: %w", task, err)
				}
			}
			st, _ := s.engine.State(task)
			if len(events) == 0 || st.Version <= from {
				return fmt.Errorf("projector: repair %s: PostgreSQL has it up to version %d, want %d", task, st.Version, head)
			}
			from = st.Version
		}
	}
	if !s.writeAll(ctx, changed) {
		return fmt.Errorf("projector: repair: %w", context.Cause(ctx))
	}
	return nil
}

// bind opens the existing buckets, as prepare does without applying
// anything: an operator's command must not change the deployment's
// streams.
func (s *Service) bind(ctx context.Context) error {
	kv, err := s.js.KeyValue(ctx, wire.BucketTasks)
	if err != nil {
		return fmt.Errorf("projector: bucket %s: %w", wire.BucketTasks, err)
	}
	marks, err := s.js.KeyValue(ctx, wire.BucketProjector)
	if err != nil {
		return fmt.Errorf("projector: bucket %s: %w", wire.BucketProjector, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return fmt.Errorf("projector: bucket %s: %w", wire.BucketTasks, err)
	}
	var maxValue int32
	if js, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		maxValue = js.StreamInfo().Config.MaxMsgSize
	}
	s.kv, s.tasks, s.marks = kv, wire.BucketTasks, marks
	s.valueLimit = valueLimit(maxValue, s.nc.MaxPayload())
	return nil
}
