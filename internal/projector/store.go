package projector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// load makes a task resident with its latest state: the one the bucket
// refused if it is held, else its stored value, else an empty state. A value
// stored without its data has the data folded again from PostgreSQL, and so
// has a value that is not a projection of its task: rewrite reports that
// the loaded state must then be written over it.
func (s *Service) load(task string) (rewrite bool, err error) {
	if h := s.held[task]; h != nil {
		return false, s.engine.Load(h.st)
	}
	ctx, cancel := context.WithTimeout(s.ctxOrBackground(), 30*time.Second)
	defer cancel()
	st := projection.State{Task: task}
	var rev uint64
	entry, err := s.kv.Get(ctx, task)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return false, fmt.Errorf("read the stored projection of %s: %w", task, err)
	default:
		rev = entry.Revision()
		if st, err = storedState(task, entry.Value()); err != nil {
			st = projection.State{Task: task, Version: -1} // refused by Load below
		}
	}
	if st.DataTooLarge != 0 {
		gap, updated := st.Gap, st.UpdatedAt
		if st, err = s.refold(ctx, task, st.Version); err != nil {
			return false, err
		}
		st.Gap, st.UpdatedAt = gap, updated
	}
	err = s.engine.Load(st)
	if errors.Is(err, projection.ErrInvalidState) {
		s.log.Error("stored value is not a projection of its task; folding the task again from PostgreSQL",
			slog.String("task", task), slog.Uint64("revision", rev), slog.String("error", err.Error()))
		if st, err = s.refold(ctx, task, 0); err == nil {
			rewrite, err = true, s.engine.Load(st)
		}
	}
	if err != nil {
		return false, fmt.Errorf("load the projection of %s: %w", task, err)
	}
	s.revs[task] = rev
	return rewrite, nil
}

// storedState decodes a value of the bucket as the state of task. It fails
// unless the value is a projection of that task; whether the engine can
// resume from it is for Engine.Load to say.
func storedState(task string, value []byte) (projection.State, error) {
	var st projection.State
	if err := json.Unmarshal(value, &st); err != nil {
		return projection.State{}, fmt.Errorf("stored value of %s is not a projection: %w", task, err)
	}
	if st.Task != task {
		return projection.State{}, fmt.Errorf("stored value of %s is the projection of %q", task, st.Task)
	}
	return st, nil
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
		rows, err := s.pool.Query(ctx, sqlRefetch, []string{task}, []int64{from}, []int64{to}, s.cfg.RefetchLimit)
		if err != nil {
			return projection.State{}, fmt.Errorf("read the events of %s from version %d: %w", task, from, err)
		}
		events, err := scanEvents(rows)
		if err != nil {
			return projection.State{}, fmt.Errorf("read the events of %s from version %d: %w", task, from, err)
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

// refetch answers the engine's due re-fetches with one query.
func (s *Service) refetch(changed map[string]projection.State) {
	due := s.engine.DueRefetches()
	if len(due) == 0 {
		return
	}
	tasks, from, to := make([]string, len(due)), make([]int64, len(due)), make([]int64, len(due))
	for i, r := range due {
		tasks[i], from[i], to[i] = r.Task, r.FromVersion, r.ToVersion
	}
	ctx, cancel := context.WithTimeout(s.ctxOrBackground(), 30*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, sqlRefetch, tasks, from, to, s.cfg.RefetchLimit)
	if err != nil {
		s.log.Warn("re-fetch failed; the engine asks again", slog.Int("tasks", len(due)), slog.String("error", err.Error()))
		return
	}
	events, err := scanEvents(rows)
	if err != nil {
		s.log.Warn("re-fetch failed; the engine asks again", slog.Int("tasks", len(due)), slog.String("error", err.Error()))
		return
	}
	for _, ev := range events {
		_ = s.offer(ev, changed) // a task due for a re-fetch is resident: nothing to load
	}
	if s.metrics != nil {
		s.metrics.refetches.Add(float64(len(due)))
		s.metrics.refetched.Add(float64(len(events)))
	}
	s.log.Debug("re-fetched", slog.Int("tasks", len(due)), slog.Int("events", len(events)))
}

func scanEvents(rows pgx.Rows) ([]projection.Event, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (projection.Event, error) {
		var ev projection.Event
		var payload string
		err := r.Scan(&ev.Task, &ev.Partition, &ev.Version, &ev.Seq, &ev.Type, &payload)
		ev.Payload = json.RawMessage(payload)
		return ev, err
	})
}

// retryHeld adds the held tasks that are due to the states to write, at
// most a batch of them per turn.
func (s *Service) retryHeld(changed map[string]projection.State) {
	now, n := time.Now(), 0
	for task, h := range s.held {
		if _, newer := changed[task]; newer || now.Before(h.next) {
			continue
		}
		changed[task] = h.st
		if n++; n == s.cfg.BatchSize {
			return
		}
	}
}

// writeAll stores every changed state, retrying transient failures until all
// are stored, held, or the service stops. It reports false if it stopped.
func (s *Service) writeAll(changed map[string]projection.State) bool {
	delay := s.cfg.RetryMin
	for len(changed) > 0 {
		changed = s.write(changed)
		if len(changed) == 0 {
			return true
		}
		if s.metrics != nil {
			s.metrics.kvRetries.Add(float64(len(changed)))
		}
		select {
		case <-s.stop:
			return false
		case <-time.After(delay):
		}
		delay = min(2*delay, s.cfg.RetryMax)
	}
	return true
}

// write publishes the states with compare-and-set on each key's revision and
// returns the ones to try again.
func (s *Service) write(changed map[string]projection.State) map[string]projection.State {
	type pending struct {
		st      projection.State
		size    int // of the value
		without bool
		f       jetstream.PubAckFuture
	}
	var ps []pending
	retry := map[string]projection.State{}
	for task, st := range changed {
		value, without, err := s.encode(st)
		if err != nil {
			s.log.Error("projection does not encode", slog.String("task", task), slog.String("error", err.Error()))
			continue
		}
		m := nats.NewMsg("$KV." + wire.BucketTasks + "." + task)
		m.Data = value
		f, err := s.js.PublishMsgAsync(m, jetstream.WithExpectLastSequencePerSubject(s.revs[task]))
		if err != nil {
			s.failed(st, len(value), without, err, retry)
			continue
		}
		ps = append(ps, pending{st, len(value), without, f})
	}
	stopping := s.ctxOrBackground().Done()
	for k, p := range ps {
		task := p.st.Task
		select {
		case ack := <-p.f.Ok():
			s.revs[task] = ack.Sequence
			if err := s.trackGap(p.st); err != nil {
				s.failed(p.st, 0, false, err, retry) // the value stands; the marker is written with it again
				continue
			}
			s.stored(p.st, p.without)
		case err := <-p.f.Err():
			s.failed(p.st, p.size, p.without, err, retry)
		case <-stopping:
			for _, p := range ps[k:] {
				retry[p.st.Task] = p.st
			}
			return retry
		}
	}
	return retry
}

// encode is the bucket value of a state: without its data if the data makes
// it too large for a value.
func (s *Service) encode(st projection.State) (value []byte, without bool, err error) {
	if value, err = json.Marshal(st); err != nil || len(value) <= s.valueLimit {
		return value, false, err
	}
	value, err = json.Marshal(st.WithoutData())
	return value, true, err
}

// stored records a state written to the bucket.
func (s *Service) stored(st projection.State, without bool) {
	task := st.Task
	if h := s.held[task]; h != nil {
		delete(s.held, task)
		s.log.Info("held projection written", slog.String("task", task), slog.Int64("version", st.Version))
	}
	switch {
	case without && !s.oversized[task]:
		s.oversized[task] = true
		s.log.Warn("projection data too large for a bucket value; stored with data null", slog.String("task", task),
			slog.Int("bytes", len(st.Data)), slog.Int("limit", s.valueLimit), slog.Int64("version", st.Version))
	case !without && s.oversized[task]:
		delete(s.oversized, task)
		s.log.Info("projection data fits a bucket value again", slog.String("task", task), slog.Int("bytes", len(st.Data)))
	}
	if s.metrics != nil {
		s.metrics.kvWrites.Inc()
		if without {
			s.metrics.withoutData.Inc()
		}
	}
}

// writeFault is what a failed write means for its state.
type writeFault int

const (
	faultTransient writeFault = iota // retry
	faultConflict                    // the key has another revision
	faultTooLarge                    // this value will never be taken
	faultFull                        // the bucket or the server is out of space
)

// classify tells the faults of a write apart by JetStream error code.
func classify(err error) writeFault {
	if errors.Is(err, nats.ErrMaxPayload) {
		return faultTooLarge
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return faultTransient
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return faultConflict
	case jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return faultTooLarge
	case errCodeStoreFailed, errCodeStorageExceeded, errCodeInsufficientResources, errCodeAccountResourcesExceeded:
		return faultFull
	}
	return faultTransient
}

// JetStream error codes (nats-server's jetstream_errors_generated.go) that
// nats.go does not name: a write refused for lack of space.
const (
	// errCodeStoreFailed: the stream refused to store the message; with
	// discard "new" (every KV bucket) it is "maximum bytes exceeded".
	errCodeStoreFailed              jetstream.ErrorCode = 10077
	errCodeStorageExceeded          jetstream.ErrorCode = 10047
	errCodeInsufficientResources    jetstream.ErrorCode = 10023
	errCodeAccountResourcesExceeded jetstream.ErrorCode = 10002
)

// failed handles a write that did not go through; size is the value's size
// and without tells whether it was already the value without data.
func (s *Service) failed(st projection.State, size int, without bool, err error, retry map[string]projection.State) {
	task := st.Task
	switch classify(err) {
	case faultConflict:
		if s.resolveConflict(st) {
			retry[task] = st
		}
	case faultTooLarge:
		if without || size == 0 {
			// Even the value without data is refused: the bucket's
			// max_value_size is absurdly small. Do not wedge on it.
			s.log.Error("bucket refuses even the projection without its data", slog.String("task", task),
				slog.Int("bytes", size), slog.String("error", err.Error()))
			s.hold(st, err)
			return
		}
		// The server's limit is below the estimate: learn it, and write
		// this one (and anything as large) without data.
		s.valueLimit = min(s.valueLimit, size-1)
		retry[task] = st
	case faultFull:
		s.hold(st, err)
	default:
		s.log.Warn("writing a projection failed; retrying", slog.String("task", task), slog.String("error", err.Error()))
		retry[task] = st
	}
}

// hold keeps a state the bucket refused, to write it again later.
func (s *Service) hold(st projection.State, err error) {
	if s.metrics != nil {
		s.metrics.kvRefused.Inc()
	}
	h := s.held[st.Task]
	if h == nil {
		h = &heldTask{delay: s.cfg.RetryMin}
		s.held[st.Task] = h
		s.log.Warn("bucket refused a projection; the task is held and written later", slog.String("task", st.Task),
			slog.Int64("version", st.Version), slog.String("error", err.Error()))
	} else {
		h.delay = min(2*h.delay, s.cfg.RetryMax)
	}
	h.st, h.next = st, time.Now().Add(h.delay)
}

// resolveConflict handles a lost compare-and-set: the key's revision is not
// the one we knew. If the stored value is newer than ours, ours is dropped
// and the task is reloaded from the bucket the next time it is seen. If it
// is the same state, gap included, nothing is left to write. Otherwise ours
// is written again on top of the stored revision: a gap that ours records
// must never be lost to a stored value of the same version without it.
func (s *Service) resolveConflict(ours projection.State) (again bool) {
	ctx, cancel := context.WithTimeout(s.ctxOrBackground(), 5*time.Second)
	defer cancel()
	task := ours.Task
	entry, err := s.kv.Get(ctx, task)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// Deleted or purged: write over the marker that says so.
		if rev, err := s.lastRevision(ctx, task); err == nil {
			s.revs[task] = rev
		}
		return true
	}
	if err != nil {
		return true
	}
	s.revs[task] = entry.Revision()
	var stored projection.State
	if json.Unmarshal(entry.Value(), &stored) != nil {
		return true
	}
	switch {
	case stored.Version > ours.Version || (stored.Version == ours.Version && stored.Seq > ours.Seq):
		s.engine.Evict(task)
		delete(s.revs, task)
		delete(s.held, task)
		return false
	case stored.Version == ours.Version && stored.Seq == ours.Seq && stored.Gap == nil && ours.Gap == nil:
		return false
	}
	return true
}

// lastRevision is the revision of a key's last entry, a delete marker
// included (kv.Get does not report one), or 0.
func (s *Service) lastRevision(ctx context.Context, task string) (uint64, error) {
	str, err := s.js.Stream(ctx, "KV_"+wire.BucketTasks)
	if err != nil {
		return 0, err
	}
	m, err := str.GetLastMsgForSubject(ctx, "$KV."+wire.BucketTasks+"."+task)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

// trackGap keeps the open-gap marker in step with a stored state: written
// when a gap opens (before the batch that opened it is acked), deleted when
// it closes. It fails if the marker could not be written.
func (s *Service) trackGap(st projection.State) error {
	ctx, cancel := context.WithTimeout(s.ctxOrBackground(), 5*time.Second)
	defer cancel()
	_, open := s.gaps[st.Task]
	switch {
	case st.Gap != nil && !open:
		if _, err := s.marks.Put(ctx, s.markKey(st.Task), []byte(wire.FormatTime(st.Gap.Since))); err != nil {
			s.log.Warn("open-gap marker not written", slog.String("task", st.Task), slog.String("error", err.Error()))
			return fmt.Errorf("write the open-gap marker of %s: %w", st.Task, err)
		}
		s.gaps[st.Task] = st.Gap.Since
	case st.Gap == nil && open:
		// A marker left behind only costs the next start a look at the task.
		_ = s.marks.Delete(ctx, s.markKey(st.Task))
		delete(s.gaps, st.Task)
	}
	return nil
}
