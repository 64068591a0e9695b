package projection

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// Engine orders the committed events of many tasks and folds them into
// per-task State. It does no I/O and starts no goroutines; it is not safe for
// concurrent use (run one per consumer, or guard it with a mutex).
type Engine struct {
	cfg   Config
	canon *canonicalizer
	merge merger // the MergeReducer's scratch space

	tasks   map[string]*task
	waiting map[*task]struct{} // tasks with a gap or a pending catch-up
	idle    idleList           // resident tasks that are not waiting, for Trim

	buffered      int
	bufferedBytes int
}

// task is the engine's record of one resident task.
type task struct {
	state State // Gap is always nil here; snapshot derives it

	buf      map[int64]pending // versions > state.Version+1 that arrived early
	bufBytes int

	// fps[i] is the fingerprint of applied version fpBase+i. The window
	// holds the last DedupWindow..2*DedupWindow applied versions.
	fps    []fingerprint
	fpBase int64

	// catchUp is set when events beyond the head had to be dropped. The
	// buffer is then empty and stays so until the head reaches mark, the
	// highest version dropped, so every dropped event is re-read.
	catchUp bool
	mark    int64

	since     time.Time // when the task began waiting at state.Version+1
	dueAt     time.Time // when DueRefetches reports it next
	inWaiting bool

	prev, next *task // idleList links; nil when not in the list
}

// pending is a buffered event with its content fingerprint.
type pending struct {
	ev Event
	fp fingerprint
}

func (t *task) isWaiting() bool { return t.catchUp || len(t.buf) > 0 }

// snapshot returns the task's state with its gap information.
func (t *task) snapshot() State {
	s := t.state
	if t.isWaiting() {
		s.Gap = &GapInfo{NextVersion: s.Version + 1, Buffered: len(t.buf), Since: t.since.UTC()}
	}
	return s
}

// New returns an Engine for cfg (after WithDefaults).
func New(cfg Config) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:     cfg,
		canon:   newCanonicalizer(),
		tasks:   make(map[string]*task),
		waiting: make(map[*task]struct{}),
	}
	e.idle.init()
	return e, nil
}

// Load makes a task resident with the state stored for it, so that Offer
// continues from there; for a task with no stored state pass State{Task: id}.
// Versions up to st.Version are then OutcomeUnverified when offered again,
// since their content is not known.
//
// A stored state with a gap means the process that wrote it held buffered
// events that are now lost, so the task is marked for a catch-up re-fetch,
// due at once. Loading a task that is already resident is a no-op unless the
// stored version is newer, in which case the stored state replaces the
// resident one and anything buffered beyond it is re-fetched.
func (e *Engine) Load(st State) error {
	if st.Task == "" || st.Version < 0 {
		return fmt.Errorf("%w: task %q version %d", ErrInvalidState, st.Task, st.Version)
	}
	if len(st.Data) > 0 && !wire.ValidJSON(st.Data) {
		return fmt.Errorf("%w: task %q: data is not valid JSON", ErrInvalidState, st.Task)
	}
	if st.DataTooLarge != 0 {
		// Folding on from null would lose the data for good.
		return fmt.Errorf("%w: task %q: stored without its data (%d bytes); fold it again from the log", ErrInvalidState,
			st.Task, st.DataTooLarge)
	}
	now := e.cfg.Now()
	gap := st.Gap
	st.Gap = nil
	t := e.tasks[st.Task]
	switch {
	case t == nil:
		t = &task{state: st}
		e.tasks[st.Task] = t
	case st.Version <= t.state.Version:
		return nil
	default:
		_, maxDropped := e.dropBuffer(t)
		t.state, t.fps = st, nil
		t.catchUp = false
		if v := max(t.mark, maxDropped); v > st.Version {
			e.enterCatchUp(t, v, now, now)
		}
	}
	if gap != nil {
		// The lost buffer held gap.Buffered distinct versions above the next
		// one, so the highest was at least this; the first catch-up read
		// covers all of them anyway, being a read of everything after the head.
		since := t.since
		e.enterCatchUp(t, st.Version+1+int64(max(gap.Buffered, 1)), now, now)
		if since.IsZero() && !gap.Since.IsZero() {
			t.since = gap.Since
		}
	}
	e.settle(t)
	return nil
}

// Offer feeds one event (from the log, a redelivery, or a re-fetch) to the
// engine and reports what it did. Offering the same event again is always
// harmless. The task must be resident (see Load), or Offer returns
// ErrNotLoaded.
//
// When err is not nil the Result still describes the task: a conflict
// (ErrConflict) changes nothing; an event that cannot be used (ErrReduce,
// or an invalid payload) leaves the task due for a catch-up re-fetch, so the
// version is read again from the database instead of skipped.
func (e *Engine) Offer(ev Event) (Result, error) {
	if ev.Task == "" || ev.Version < 1 {
		return Result{}, fmt.Errorf("%w: task %q version %d", ErrInvalidEvent, ev.Task, ev.Version)
	}
	t := e.tasks[ev.Task]
	if t == nil {
		return Result{}, fmt.Errorf("offer task %q version %d: %w", ev.Task, ev.Version, ErrNotLoaded)
	}
	if len(ev.Payload) == 0 {
		ev.Payload = nullJSON // docs/contract.md §2: an empty body is null
	}
	now := e.cfg.Now()
	var res Result
	fp, err := e.canon.fingerprint(ev.Type, ev.Payload)
	switch {
	case err != nil:
		err = fmt.Errorf("%w: task %q version %d: %v", ErrInvalidEvent, ev.Task, ev.Version, err)
		res = Result{Outcome: OutcomeRejected}
		if _, buffered := t.buf[ev.Version]; !buffered && ev.Version > t.state.Version {
			// The log holds valid JSON, so this copy was damaged on the way;
			// the database has a good one.
			res.Changed = e.enterCatchUp(t, ev.Version, now, now)
		}
	case ev.Version <= t.state.Version:
		res, err = t.checkApplied(ev, fp)
	case ev.Snapshot || t.state.Kind == KindSnapshot:
		res, err = e.applySnapshot(t, ev, fp, now)
	case ev.Version == t.state.Version+1:
		res, err = e.apply(t, ev, fp, now)
	default:
		res, err = e.hold(t, ev, fp, now)
	}
	if res.Changed {
		t.state.UpdatedAt = now.UTC()
	}
	e.settle(t)
	res.State = t.snapshot()
	return res, err
}

// checkApplied classifies a version the task has already applied.
func (t *task) checkApplied(ev Event, fp fingerprint) (Result, error) {
	k := ev.Version - t.fpBase
	if k < 0 || k >= int64(len(t.fps)) {
		return Result{Outcome: OutcomeUnverified}, nil
	}
	if t.fps[k] == fp {
		return Result{Outcome: OutcomeDuplicate}, nil
	}
	return Result{Outcome: OutcomeConflict}, fmt.Errorf("%w: task %q version %d (type %q) differs from the applied copy",
		ErrConflict, ev.Task, ev.Version, ev.Type)
}

// apply applies the next version and every buffered version that follows it.
func (e *Engine) apply(t *task, ev Event, fp fingerprint, now time.Time) (Result, error) {
	if err := e.reduce(t, ev, fp, now); err != nil {
		return Result{Outcome: OutcomeRejected, Changed: e.enterCatchUp(t, ev.Version, now, e.retryAt(now))}, err
	}
	res := Result{Outcome: OutcomeApplied, Applied: 1, Changed: true}
	var err error
	for len(t.buf) > 0 {
		p, ok := t.buf[t.state.Version+1]
		if !ok {
			break
		}
		e.unbuffer(t, p)
		if err = e.reduce(t, p.ev, p.fp, now); err != nil {
			e.enterCatchUp(t, p.ev.Version, now, e.retryAt(now))
			break
		}
		res.Applied++
	}
	if t.catchUp && t.state.Version >= t.mark {
		t.catchUp = false
	}
	if t.isWaiting() {
		// Progress restarts the clock: the task now waits at a new version,
		// and the versions in flight are evidently arriving.
		t.since, t.dueAt = now, e.retryAt(now)
	}
	return res, err
}

// applySnapshot applies a snapshot task's event above the task's version:
// it is the whole state, so it does not wait for the versions it skips,
// and it replaces whatever was folded before. Anything buffered at or
// below it is dropped (a snapshot task buffers nothing of its own).
func (e *Engine) applySnapshot(t *task, ev Event, fp fingerprint, now time.Time) (Result, error) {
	base := State{Task: t.state.Task, Partition: t.state.Partition}
	var next State
	if _, ok := e.cfg.Reducer.(MergeReducer); ok {
		next.Status, next.Data = ev.Type, trimSpace(ev.Payload)
	} else {
		var err error
		if next, err = e.cfg.Reducer.Reduce(base, ev); err != nil {
			err = fmt.Errorf("%w: task %q version %d: %w", ErrReduce, ev.Task, ev.Version, err)
			return Result{Outcome: OutcomeRejected, Changed: e.enterCatchUp(t, ev.Version, now, e.retryAt(now))}, err
		}
	}
	next.Task, next.Partition, next.Version, next.Seq, next.UpdatedAt, next.Gap, next.Kind =
		t.state.Task, ev.Partition, ev.Version, ev.Seq, now.UTC(), nil, KindSnapshot
	t.state = next
	// The fingerprints are of consecutive versions; a snapshot task keeps
	// only its newest, so an older version is unverified, never a conflict.
	t.fps, t.fpBase = append(t.fps[:0], fp), ev.Version
	for v, p := range t.buf {
		if v <= ev.Version {
			e.unbuffer(t, p)
		}
	}
	if t.catchUp && t.state.Version >= t.mark {
		t.catchUp = false
	}
	return Result{Outcome: OutcomeApplied, Applied: 1, Changed: true}, nil
}

// KindSnapshot is State.Kind of a snapshot task.
const KindSnapshot = "snapshot"

// retryAt is when a task that starts waiting now is due for a re-fetch.
func (e *Engine) retryAt(now time.Time) time.Time { return now.Add(e.cfg.GapTimeout) }

// reduce folds one next-version event into the task's state.
func (e *Engine) reduce(t *task, ev Event, fp fingerprint, now time.Time) error {
	var next State
	if r, ok := e.cfg.Reducer.(MergeReducer); ok {
		next = r.reduce(t.state, ev, &e.merge)
	} else {
		var err error
		if next, err = e.cfg.Reducer.Reduce(t.state, ev); err != nil {
			return fmt.Errorf("%w: task %q version %d: %w", ErrReduce, ev.Task, ev.Version, err)
		}
	}
	next.Task, next.Partition, next.Version, next.Seq, next.UpdatedAt, next.Gap =
		t.state.Task, ev.Partition, ev.Version, ev.Seq, now.UTC(), nil
	t.state = next
	t.remember(ev.Version, fp, e.cfg.DedupWindow)
	return nil
}

// remember records the fingerprint of the version just applied.
func (t *task) remember(v int64, fp fingerprint, window int) {
	if len(t.fps) == 0 {
		t.fpBase = v
	}
	// Compacting only when the slice reaches twice the window keeps the cost
	// per event constant and lets short tasks use short slices.
	if len(t.fps) >= 2*window {
		n := copy(t.fps, t.fps[len(t.fps)-window:])
		t.fps = t.fps[:n]
		t.fpBase = v - int64(n)
	}
	t.fps = append(t.fps, fp)
}

// hold handles a version beyond the next one: buffer it, or drop it under a
// catch-up.
func (e *Engine) hold(t *task, ev Event, fp fingerprint, now time.Time) (Result, error) {
	if p, ok := t.buf[ev.Version]; ok {
		if p.fp == fp {
			return Result{Outcome: OutcomeDuplicate}, nil
		}
		return Result{Outcome: OutcomeConflict}, fmt.Errorf("%w: task %q version %d (type %q) differs from the buffered copy (type %q)",
			ErrConflict, ev.Task, ev.Version, ev.Type, p.ev.Type)
	}
	if t.catchUp || len(t.buf) >= e.cfg.MaxBufferedPerTask || e.buffered >= e.cfg.MaxBuffered ||
		e.bufferedBytes+len(ev.Payload) > e.cfg.MaxBufferedBytes {
		// An overflow means the task is far behind: waiting for the gap
		// timeout would only let more events pile up, so it is due at once.
		return Result{Outcome: OutcomeDeferred, Changed: e.enterCatchUp(t, ev.Version, now, now)}, nil
	}
	if !t.isWaiting() {
		t.since, t.dueAt = now, e.retryAt(now)
	}
	if t.buf == nil {
		t.buf = make(map[int64]pending)
	}
	t.buf[ev.Version] = pending{ev: ev, fp: fp}
	t.bufBytes += len(ev.Payload)
	e.buffered++
	e.bufferedBytes += len(ev.Payload)
	if t.state.Version == 0 {
		t.state.Partition = ev.Partition // so that the first KV value is keyed right
	}
	return Result{Outcome: OutcomeBuffered, Changed: true}, nil
}

// enterCatchUp drops the task's buffer and makes it due at time due for a
// read of everything after its head, until the head reaches version v and
// every dropped version. It reports whether the visible state changed.
func (e *Engine) enterCatchUp(t *task, v int64, now, due time.Time) bool {
	was, buffered := t.isWaiting(), len(t.buf)
	_, maxDropped := e.dropBuffer(t)
	t.mark = max(t.mark, v, maxDropped)
	if !t.catchUp {
		// Once catching up, further drops are covered by the same request;
		// moving its time would make the owner ask again and again.
		t.dueAt = due
	}
	t.catchUp = true
	if !was {
		t.since = now
	}
	return !was || buffered > 0
}

// dropBuffer empties the task's buffer and returns how many events it held
// and the highest version among them.
func (e *Engine) dropBuffer(t *task) (n int, maxVersion int64) {
	for v := range t.buf {
		maxVersion = max(maxVersion, v)
	}
	n = len(t.buf)
	e.buffered -= n
	e.bufferedBytes -= t.bufBytes
	t.buf, t.bufBytes = nil, 0 // release the map: a large one would stay large
	return n, maxVersion
}

// unbuffer removes one buffered event.
func (e *Engine) unbuffer(t *task, p pending) {
	delete(t.buf, p.ev.Version)
	t.bufBytes -= len(p.ev.Payload)
	e.buffered--
	e.bufferedBytes -= len(p.ev.Payload)
	if len(t.buf) == 0 {
		t.buf = nil
	}
}

// settle files the task in the waiting set or the idle list after a change.
func (e *Engine) settle(t *task) {
	if t.isWaiting() {
		e.idle.remove(t)
		if !t.inWaiting {
			e.waiting[t] = struct{}{}
			t.inWaiting = true
		}
		return
	}
	if t.inWaiting {
		delete(e.waiting, t)
		t.inWaiting = false
		t.since, t.dueAt = time.Time{}, time.Time{}
	}
	e.idle.pushFront(t)
}

// DueRefetches returns the tasks whose wait has lasted GapTimeout (or that
// need a catch-up), sorted by task id, and restarts their timers so that each
// is reported again only after another GapTimeout if still unresolved. The
// owner reads the versions from the database and offers them in order; the
// buffers stay in place meanwhile.
func (e *Engine) DueRefetches() []Refetch {
	now := e.cfg.Now()
	var out []Refetch
	for t := range e.waiting {
		if now.Before(t.dueAt) {
			continue
		}
		t.dueAt = now.Add(e.cfg.GapTimeout)
		r := Refetch{Task: t.state.Task, Partition: t.state.Partition, FromVersion: t.state.Version + 1, CatchUp: t.catchUp}
		if !t.catchUp {
			lowest := int64(-1)
			for v := range t.buf {
				if lowest < 0 || v < lowest {
					lowest = v
				}
			}
			r.ToVersion = lowest - 1
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Refetch) int { return cmp.Compare(a.Task, b.Task) })
	return out
}

// State returns the current state of a resident task.
func (e *Engine) State(taskID string) (State, bool) {
	t := e.tasks[taskID]
	if t == nil {
		return State{}, false
	}
	return t.snapshot(), true
}

// Evict forgets a resident task that is not waiting (no gap, no catch-up),
// so that it must be loaded again before its next Offer. It reports whether
// the task was evicted. Evict a task only once its latest State is durable
// in KV, because that is what the next Load will read.
func (e *Engine) Evict(taskID string) bool {
	t := e.tasks[taskID]
	if t == nil || t.isWaiting() {
		return false
	}
	e.idle.remove(t)
	delete(e.tasks, taskID)
	return true
}

// Trim evicts the least recently offered tasks that are not waiting until at
// most Config.MaxTasks are resident, and returns the ids of the tasks it
// evicted (nil if none), so that the owner can forget what it keeps about
// them, and only about them. The owner calls it when the KV writes of earlier
// Results are durable (after each batch, say), for the reason given at Evict.
func (e *Engine) Trim() []string {
	var evicted []string
	for len(e.tasks) > e.cfg.MaxTasks {
		t := e.idle.back()
		if t == nil {
			break
		}
		e.idle.remove(t)
		delete(e.tasks, t.state.Task)
		evicted = append(evicted, t.state.Task)
	}
	return evicted
}

// Stats returns the engine's gauges.
func (e *Engine) Stats() Stats {
	return Stats{Tasks: len(e.tasks), Waiting: len(e.waiting), Buffered: e.buffered, BufferedBytes: e.bufferedBytes}
}

// idleList is an intrusive doubly linked list of tasks, most recently
// offered first, so that Trim finds eviction candidates without a scan.
type idleList struct{ root task }

func (l *idleList) init() { l.root.next, l.root.prev = &l.root, &l.root }

func (l *idleList) remove(t *task) {
	if t.next == nil {
		return
	}
	t.prev.next, t.next.prev = t.next, t.prev
	t.prev, t.next = nil, nil
}

func (l *idleList) pushFront(t *task) {
	if l.root.next == t {
		return
	}
	l.remove(t)
	t.prev, t.next = &l.root, l.root.next
	l.root.next.prev = t
	l.root.next = t
}

func (l *idleList) back() *task {
	if l.root.prev == &l.root {
		return nil
	}
	return l.root.prev
}
