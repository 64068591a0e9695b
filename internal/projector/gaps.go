package projector

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// Missing versions: the engine asks for them, PostgreSQL has them. A task
// that waits for one has a marker in the bucket ledger_projector, so that a
// restarted projector asks again even if no event of the task ever arrives.

// readTimeout bounds one read of the bucket or of PostgreSQL; markTimeout
// one write or delete of a marker, and the read that resolves a lost
// compare-and-set.
const (
	readTimeout = 30 * time.Second
	markTimeout = 5 * time.Second
)

// refetch answers the engine's due re-fetches with one query.
func (s *Service) refetch(ctx context.Context, changed map[string]projection.State) {
	due := s.engine.DueRefetches()
	if len(due) == 0 {
		return
	}
	tasks, from, to := make([]string, len(due)), make([]int64, len(due)), make([]int64, len(due))
	for i, r := range due {
		tasks[i], from[i], to[i] = r.Task, r.FromVersion, r.ToVersion
	}
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	events, err := s.queryEvents(ctx, tasks, from, to)
	if err != nil {
		s.log.Warn("re-fetch failed; the engine asks again", slog.Int("tasks", len(due)), slog.String("error", err.Error()))
		return
	}
	for _, ev := range events {
		_ = s.offer(ctx, ev, changed, nil) // a task due for a re-fetch is resident: nothing to load
	}
	s.reportArchivedRefetch(ctx, due, events)
	s.metrics.refetches.Add(float64(len(due)))
	s.metrics.refetched.Add(float64(len(events)))
	s.log.Debug("re-fetched", slog.Int("tasks", len(due)), slog.Int("events", len(events)))
}

// queryEvents reads versions from[i]..to[i] (to[i] 0: all after from[i]) of
// each tasks[i], at most RefetchLimit of each.
func (s *Service) queryEvents(ctx context.Context, tasks []string, from, to []int64) ([]projection.Event, error) {
	rows, err := s.pool.Query(ctx, sqlRefetch, tasks, from, to, s.cfg.RefetchLimit)
	if err != nil {
		return nil, fmt.Errorf("read the events of %d tasks: %w", len(tasks), err)
	}
	events, err := scanEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("read the events of %d tasks: %w", len(tasks), err)
	}
	return events, nil
}

func scanEvents(rows pgx.Rows) ([]projection.Event, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (projection.Event, error) {
		var ev projection.Event
		var payload string
		err := r.Scan(&ev.Task, &ev.Partition, &ev.Version, &ev.Seq, &ev.Type, &payload, &ev.Snapshot)
		ev.Payload = json.RawMessage(payload)
		return ev, err
	})
}

// refold folds a task's events from PostgreSQL, versions 1 through to (0:
// all), into a state, with the engine's reducer.
func (s *Service) refold(ctx context.Context, task string, to int64) (projection.State, error) {
	engine, err := projection.New(s.cfg.Engine)
	if err != nil {
		return projection.State{}, err
	}
	if err := engine.Load(projection.State{Task: task}); err != nil {
		return projection.State{}, err
	}
	for from := int64(1); ; {
		events, err := s.queryEvents(ctx, []string{task}, []int64{from}, []int64{to})
		if err != nil {
			return projection.State{}, fmt.Errorf("fold %s again from version %d: %w", task, from, err)
		}
		for _, ev := range events {
			if _, err := engine.Offer(ev); err != nil {
				return projection.State{}, fmt.Errorf("fold %s again: %w", task, err)
			}
		}
		if len(events) < s.cfg.RefetchLimit {
			break
		}
		from = events[len(events)-1].Version + 1
	}
	st, _ := engine.State(task)
	if st.Gap != nil || (to > 0 && st.Version != to) {
		return projection.State{}, fmt.Errorf("fold %s again: PostgreSQL has it up to version %d, want %d", task, st.Version, to)
	}
	return st, nil
}

// markKey is the open-gap marker of a task for this projector's consumer.
func (s *Service) markKey(task string) string { return s.cfg.durable() + "." + task }

// trackGap keeps the open-gap marker in step with a stored state: written
// when a gap opens (before the batch that opened it is acked), deleted when
// it closes. It fails if the marker could not be written.
func (s *Service) trackGap(ctx context.Context, st projection.State) error {
	_, open := s.gaps[st.Task]
	if (st.Gap != nil) == open {
		return nil // nearly every write: no marker to write or delete
	}
	ctx, cancel := context.WithTimeout(ctx, markTimeout)
	defer cancel()
	if open {
		// The gap closed. A marker left behind only costs the next start a
		// look at the task.
		_ = s.marks.Delete(ctx, s.markKey(st.Task))
		delete(s.gaps, st.Task)
		return nil
	}
	if _, err := s.marks.Put(ctx, s.markKey(st.Task), []byte(wire.FormatTime(st.Gap.Since))); err != nil {
		s.log.Warn("open-gap marker not written", slog.String("task", st.Task), slog.String("error", err.Error()))
		return fmt.Errorf("write the open-gap marker of %s: %w", st.Task, err)
	}
	s.gaps[st.Task] = st.Gap.Since
	return nil
}

// resumeGaps loads every task a previous run left waiting for a missing
// version, so that the engine re-fetches it even if no event of it arrives.
func (s *Service) resumeGaps(ctx context.Context) error {
	prefix := s.cfg.durable() + "."
	lister, err := s.marks.ListKeysFiltered(ctx, prefix+">")
	if err != nil {
		return fmt.Errorf("projector: list open gaps: %w", err)
	}
	var tasks []string
	for key := range lister.Keys() {
		tasks = append(tasks, key[len(prefix):])
	}
	for _, task := range tasks {
		if _, loaded := s.engine.State(task); loaded {
			continue
		}
		if _, err := s.load(ctx, task, nil); err != nil {
			return fmt.Errorf("projector: resume gap of %s: %w", task, err)
		}
		if st, _ := s.engine.State(task); st.Gap != nil {
			s.gaps[task] = st.Gap.Since
		} else {
			_ = s.marks.Delete(ctx, s.markKey(task))
		}
	}
	if len(tasks) > 0 {
		s.log.Info("resumed open gaps", slog.Int("tasks", len(tasks)))
	}
	return nil
}
