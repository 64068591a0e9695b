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

// rebuildChunk is how many events one scan query reads.
const rebuildChunk = 20_000

// Progress reports a rebuild's advance.
type Progress struct {
	Done, Total int64
	Elapsed     time.Duration
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
	if err := s.js.DeleteConsumer(ctx, wire.StreamLog, s.cfg.durable()); err != nil &&
		!errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("projector: rebuild: delete consumer: %w", err)
	}
	whole := s.cfg.Partitions == nil
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
		return err
	}
	s.engine, s.revs, s.gaps, s.held = engine, map[string]uint64{}, map[string]time.Time{}, map[string]*heldTask{}
	seen := map[string]bool{} // tasks this rebuild has begun
	s.ctx = ctx
	defer func() { s.ctx = nil }()

	parts := s.cfg.partitionsOrAll()
	var total, last int64
	if err := s.pool.QueryRow(ctx, sqlScanCount, parts).Scan(&total, &last); err != nil {
		return fmt.Errorf("projector: rebuild: count: %w", err)
	}
	start := time.Now()
	var done, cursor int64
	for cursor < last {
		rows, err := s.pool.Query(ctx, sqlScan, cursor, parts, rebuildChunk)
		if err != nil {
			return fmt.Errorf("projector: rebuild: scan after seq %d: %w", cursor, err)
		}
		events, err := scanEvents(rows)
		if err != nil {
			return fmt.Errorf("projector: rebuild: scan after seq %d: %w", cursor, err)
		}
		if len(events) == 0 {
			break
		}
		changed := map[string]projection.State{}
		for _, ev := range events {
			if err := s.rebuildOffer(ctx, ev, changed, whole, seen); err != nil {
				return err
			}
		}
		s.refetch(changed)
		if !s.writeAll(changed) {
			return errors.New("projector: rebuild: stopped")
		}
		s.trim()
		cursor = events[len(events)-1].Seq
		done += int64(len(events))
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
	s.log.Info("rebuild done", slog.Int64("events", done), slog.Duration("took", time.Since(start)))
	return nil
}

// rebuildOffer offers a scanned event; a task seen for the first time starts
// from an empty state (its stored value, if any, is only overwritten).
func (s *Service) rebuildOffer(ctx context.Context, ev projection.Event, changed map[string]projection.State, whole bool,
	seen map[string]bool) error {
	if _, ok := s.engine.State(ev.Task); !ok {
		if seen[ev.Task] {
			// Trimmed after its value was written: continue from the bucket.
			if _, err := s.load(ev.Task); err != nil {
				return fmt.Errorf("projector: rebuild: load %s: %w", ev.Task, err)
			}
		} else {
			s.revs[ev.Task] = 0
			if !whole {
				entry, err := s.kv.Get(ctx, ev.Task)
				if err == nil {
					s.revs[ev.Task] = entry.Revision()
				} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
					return fmt.Errorf("projector: rebuild: read %s: %w", ev.Task, err)
				}
			}
			if err := s.engine.Load(projection.State{Task: ev.Task}); err != nil {
				return err
			}
			seen[ev.Task] = true
		}
	}
	if err := s.offer(ev, changed); err != nil {
		return fmt.Errorf("projector: rebuild: %w", err)
	}
	return nil
}
