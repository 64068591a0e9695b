package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// scanChunk is how many events one scan query of a rebuild reads.
const scanChunk = 20_000

// Progress reports a rebuild's advance.
type Progress struct {
	// Done is how many events were replayed, of Total: the events of the
	// partitions when the rebuild began.
	Done, Total int64
	// Elapsed is the time since the scan began.
	Elapsed time.Duration
}

// Rebuild replays the committed log from PostgreSQL into fresh projections
// of the service's partitions, then returns; Start afterwards resumes live
// consumption. It must run before Start, with no other projector running on
// the same partitions.
//
// Nothing that commits meanwhile is lost: the consumer is recreated, at the
// log's current end, before the scan begins. An event committed before that
// is seen by the scan; one committed after has its log copy delivered to the
// new consumer; one seen by both is a duplicate to the engine.
//
// For every partition the bucket is deleted and created anew; for a subset,
// the subset's tasks are overwritten and the other tasks are left alone.
func (s *Service) Rebuild(ctx context.Context, progress func(Progress)) error {
	whole := s.cfg.Partitions == nil
	if err := s.resetForRebuild(ctx, whole); err != nil {
		return err
	}
	parts := s.cfg.partitionsOrAll()
	var total, last int64
	if err := s.pool.QueryRow(ctx, sqlScanCount, parts).Scan(&total, &last); err != nil {
		return fmt.Errorf("projector: rebuild: count: %w", err)
	}
	start := time.Now()
	seen := map[string]bool{} // tasks this rebuild has begun
	var done, cursor int64
	for cursor < last {
		n, next, err := s.rebuildChunk(ctx, cursor, parts, whole, seen)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		cursor, done = next, done+int64(n)
		if progress != nil {
			progress(Progress{Done: done, Total: total, Elapsed: time.Since(start)})
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if len(s.held) > 0 {
		return fmt.Errorf("projector: rebuild: the bucket refused the projections of %d tasks for lack of space (see ledger_projector_kv_refused_total); raise its max_bytes and rebuild again", len(s.held))
	}
	s.log.Info("rebuild done", slog.Int64("events", done), slog.String("took", time.Since(start).String()))
	return nil
}

// resetForRebuild recreates the consumer at the log's end, the whole bucket
// if the rebuild is of every partition, and an empty engine.
func (s *Service) resetForRebuild(ctx context.Context, whole bool) error {
	if err := s.js.DeleteConsumer(ctx, wire.StreamLog, s.cfg.durable()); err != nil &&
		!errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("projector: rebuild: delete consumer: %w", err)
	}
	if whole {
		if err := s.js.DeleteKeyValue(ctx, wire.BucketTasks); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("projector: rebuild: delete bucket: %w", err)
		}
	}
	if err := s.prepare(ctx); err != nil {
		return err
	}
	if _, err := s.consumer(ctx, jetstream.DeliverNewPolicy); err != nil {
		return err
	}
	engine, err := projection.New(s.cfg.Engine)
	if err != nil {
		return fmt.Errorf("projector: rebuild: %w", err)
	}
	s.engine, s.revs, s.gaps, s.held = engine, map[string]uint64{}, map[string]time.Time{}, map[string]*heldTask{}
	return nil
}

// rebuildChunk folds and stores the events after seq cursor, a chunk of
// them, and returns how many it read and the seq of the last one.
func (s *Service) rebuildChunk(ctx context.Context, cursor int64, parts []int32, whole bool, seen map[string]bool) (
	n int, last int64, err error) {
	rows, err := s.pool.Query(ctx, sqlScan, cursor, parts, scanChunk)
	if err != nil {
		return 0, 0, fmt.Errorf("projector: rebuild: scan after seq %d: %w", cursor, err)
	}
	events, err := scanEvents(rows)
	if err != nil {
		return 0, 0, fmt.Errorf("projector: rebuild: scan after seq %d: %w", cursor, err)
	}
	if len(events) == 0 {
		return 0, cursor, nil
	}
	changed := map[string]projection.State{}
	for _, ev := range events {
		if err := s.rebuildOffer(ctx, ev, changed, whole, seen); err != nil {
			return 0, 0, err
		}
	}
	s.refetch(ctx, changed)
	if !s.writeAll(ctx, changed) {
		if err := ctx.Err(); err != nil {
			return 0, 0, fmt.Errorf("projector: rebuild: write the projections after seq %d: %w", cursor, err)
		}
		return 0, 0, errors.New("projector: rebuild: stopped")
	}
	s.trim()
	return len(events), events[len(events)-1].Seq, nil
}

// rebuildOffer offers a scanned event; a task seen for the first time starts
// from an empty state (its stored value, if any, is only overwritten).
func (s *Service) rebuildOffer(ctx context.Context, ev projection.Event, changed map[string]projection.State, whole bool,
	seen map[string]bool) error {
	if _, ok := s.engine.State(ev.Task); !ok {
		if err := s.rebuildBegin(ctx, ev.Task, whole, seen); err != nil {
			return err
		}
	}
	if err := s.offer(ctx, ev, changed); err != nil {
		return fmt.Errorf("projector: rebuild: %w", err)
	}
	return nil
}

// rebuildBegin makes a task resident for the rebuild: from the bucket if
// the rebuild wrote it already (and trimmed it since), else empty, at the
// revision of the value it overwrites.
func (s *Service) rebuildBegin(ctx context.Context, task string, whole bool, seen map[string]bool) error {
	if seen[task] {
		if _, err := s.load(ctx, task); err != nil {
			return fmt.Errorf("projector: rebuild: load %s: %w", task, err)
		}
		return nil
	}
	s.revs[task] = 0
	if !whole {
		entry, err := s.kv.Get(ctx, task)
		if err == nil {
			s.revs[task] = entry.Revision()
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("projector: rebuild: read %s: %w", task, err)
		}
	}
	if err := s.engine.Load(projection.State{Task: task}); err != nil {
		return fmt.Errorf("projector: rebuild: begin %s: %w", task, err)
	}
	seen[task] = true
	return nil
}
