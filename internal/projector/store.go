package projector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/projection"
)

// load makes a task resident with its latest state: the one the bucket
// refused if it is held, else its stored value (as read holds it, when it
// was read ahead), else an empty state. A value stored without its data has
// the data folded again from PostgreSQL, and so has a value that is not a
// projection of its task: rewrite reports that the loaded state must then
// be written over it.
func (s *Service) load(ctx context.Context, task string, read readAhead) (rewrite bool, err error) {
	if h := s.held[task]; h != nil {
		return false, s.engine.Load(h.st)
	}
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	st, rev, err := s.readStored(ctx, task, read)
	if err != nil {
		return false, err
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

// readStored reads a task's value and its revision (or takes what read
// holds of it): an empty state at
// revision 0 if there is none, a state Engine.Load refuses if the value is
// not a projection of the task, and the data folded again from PostgreSQL
// if the value was stored without it.
func (s *Service) readStored(ctx context.Context, task string, read readAhead) (projection.State, uint64, error) {
	entry, err := read.take(task)
	if entry == nil && err == nil {
		entry, err = s.kv.Get(ctx, task)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return projection.State{Task: task}, 0, nil
	case err != nil:
		return projection.State{}, 0, fmt.Errorf("read the stored projection of %s: %w", task, err)
	}
	st, err := storedState(task, entry.Value())
	if err != nil {
		return projection.State{Task: task, Version: -1}, entry.Revision(), nil // refused by Load
	}
	if st.DataTooLarge != 0 {
		gap, updated := st.Gap, st.UpdatedAt
		if st, err = s.refold(ctx, task, st.Version); err != nil {
			return projection.State{}, 0, err
		}
		st.Gap, st.UpdatedAt = gap, updated
	}
	return st, entry.Revision(), nil
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

// heldTask is a task whose latest state the bucket refused.
type heldTask struct {
	st    projection.State
	next  time.Time     // when to write it again
	delay time.Duration // backoff, RetryMin doubling to RetryMax
	// keep is the newest version among the task's log messages: its message
	// stays unacked while the task is held.
	keep int64
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
func (s *Service) writeAll(ctx context.Context, changed map[string]projection.State) bool {
	delay := s.cfg.RetryMin
	for len(changed) > 0 {
		changed = s.write(ctx, changed)
		if len(changed) == 0 {
			return true
		}
		s.metrics.kvRetries.Add(float64(len(changed)))
		wait := time.NewTimer(delay)
		select {
		case <-s.stop:
			wait.Stop()
			return false
		case <-ctx.Done():
			wait.Stop()
			return false
		case <-wait.C:
		}
		delay = min(2*delay, s.cfg.RetryMax)
	}
	return true
}

// pendingWrite is a value published to the bucket whose ack is awaited.
type pendingWrite struct {
	st      projection.State
	size    int  // of the value
	without bool // the value leaves the data out
	ack     jetstream.PubAckFuture
}

// write publishes the states with compare-and-set on each key's revision and
// returns the ones to try again.
func (s *Service) write(ctx context.Context, changed map[string]projection.State) map[string]projection.State {
	retry := map[string]projection.State{}
	pending := s.publish(ctx, changed, retry)
	for k, p := range pending {
		select {
		case ack := <-p.ack.Ok():
			s.revs[p.st.Task] = ack.Sequence
			if err := s.trackGap(ctx, p.st); err != nil {
				s.failed(ctx, p.st, 0, false, err, retry) // the value stands; the marker is written with it again
				continue
			}
			s.stored(p.st, p.without)
		case err := <-p.ack.Err():
			s.failed(ctx, p.st, p.size, p.without, err, retry)
		case <-ctx.Done():
			for _, p := range pending[k:] {
				retry[p.st.Task] = p.st
			}
			return retry
		}
	}
	return retry
}

// publish sends the value of each state, expecting the key's known
// revision; a state whose value could not be sent is handled as a failed
// write at once.
func (s *Service) publish(ctx context.Context, changed, retry map[string]projection.State) []pendingWrite {
	var pending []pendingWrite
	for task, st := range changed {
		value, without, err := s.encode(st, s.writers[task])
		delete(s.writers, task)
		if err != nil {
			s.log.Error("projection does not encode", slog.String("task", task), slog.String("error", err.Error()))
			continue
		}
		m := nats.NewMsg("$KV." + s.tasks + "." + task)
		m.Data = value
		f, err := s.js.PublishMsgAsync(m, jetstream.WithExpectLastSequencePerSubject(s.revs[task]))
		if err != nil {
			s.failed(ctx, st, len(value), without, err, retry)
			continue
		}
		pending = append(pending, pendingWrite{st, len(value), without, f})
	}
	return pending
}

// encode is the bucket value of a state: without its data if the data makes
// it too large for a value, or its writer's principal is over its share of
// the bucket ("" charges no one: a value written again after a failure was
// charged the first time).
func (s *Service) encode(st projection.State, principal string) (value []byte, without bool, err error) {
	// A value of its own each: an async publish may send it again.
	if value, err = st.AppendJSON(make([]byte, 0, stateJSONRoom+len(st.Data))); err != nil {
		return value, false, err
	}
	if len(value) <= s.valueLimit {
		if principal == "" || s.quota.Take(principal, len(value)) {
			return value, false, nil
		}
		s.metrics.refused(principal)
	}
	value, err = st.WithoutData().AppendJSON(make([]byte, 0, stateJSONRoom))
	return value, true, err
}

// stateJSONRoom is about the size of a value without its data: a task id
// and the fields around them.
const stateJSONRoom = 256

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
		s.log.Warn("projection stored with data null: too large for a bucket value, or its writer over its share of the bucket", slog.String("task", task),
			slog.Int("bytes", len(st.Data)), slog.Int("limit", s.valueLimit), slog.Int64("version", st.Version))
	case !without && s.oversized[task]:
		delete(s.oversized, task)
		s.log.Info("projection data fits a bucket value again", slog.String("task", task), slog.Int("bytes", len(st.Data)))
	}
	s.metrics.kvWrites.Inc()
	if without {
		s.metrics.withoutData.Inc()
	}
}

// readAheadMax bounds the bucket reads a batch makes at once.
const readAheadMax = 16

// readAhead holds, per task, the bucket's answer for a task the engine did
// not hold when the batch began: its entry, or the read's error
// (jetstream.ErrKeyNotFound for a task the bucket has no value of).
type readAhead map[string]readResult

type readResult struct {
	entry jetstream.KeyValueEntry
	err   error
}

// take hands out the answer read ahead for task, once: a later load of it
// (the task evicted and met again) reads anew. Neither is set when nothing
// was read ahead.
func (r readAhead) take(task string) (jetstream.KeyValueEntry, error) {
	res, ok := r[task]
	if !ok {
		return nil, nil
	}
	delete(r, task)
	if res.err == nil && res.entry == nil {
		return nil, errors.New("projector: a read ahead returned neither a value nor an error")
	}
	return res.entry, res.err
}

// readAhead reads, up to readAheadMax at a time, the bucket values of the
// batch's tasks that the engine does not hold and that are not held back:
// each would otherwise cost the batch a round trip of its own, one after
// another (a burst of new tasks is a burst of them). Only this loop writes
// the tasks of its partitions, and only after the batch is offered, so what
// is read here is what a read at the task's first event would see.
func (s *Service) readAhead(ctx context.Context, events []projection.Event) readAhead {
	var tasks []string
	for _, t := range s.unread(events) {
		if _, resident := s.engine.State(t); !resident {
			tasks = append(tasks, t)
		}
	}
	return s.readTasks(ctx, tasks)
}

// readValues reads the bucket values of the events' tasks, resident or
// not, that are not held back.
func (s *Service) readValues(ctx context.Context, events []projection.Event) readAhead {
	return s.readTasks(ctx, s.unread(events))
}

// unread is the distinct tasks of events that are not held back.
func (s *Service) unread(events []projection.Event) []string {
	var tasks []string
	seen := map[string]bool{}
	for _, ev := range events {
		if ev.Task == "" || seen[ev.Task] || s.held[ev.Task] != nil {
			continue
		}
		seen[ev.Task] = true
		tasks = append(tasks, ev.Task)
	}
	return tasks
}

// readTasks reads the tasks' values, up to readAheadMax at a time.
func (s *Service) readTasks(ctx context.Context, tasks []string) readAhead {
	if len(tasks) < 2 {
		return nil // one read: load makes it
	}
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	results := make([]readResult, len(tasks))
	sem := make(chan struct{}, readAheadMax)
	var wg sync.WaitGroup
	for i, task := range tasks {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			entry, err := s.kv.Get(ctx, task)
			results[i] = readResult{entry, err}
		}()
	}
	wg.Wait()
	read := make(readAhead, len(tasks))
	for i, task := range tasks {
		read[task] = results[i]
	}
	return read
}
