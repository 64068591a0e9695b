package worker

import (
	"sync"
	"testing"
	"time"
)

// lateRuns records the lookups a lateVerdicts ran, and when.
type lateRuns struct {
	mu  sync.Mutex
	at  map[*Pending]time.Time
	ran map[*Pending]int
}

func newLateRuns() *lateRuns {
	return &lateRuns{at: map[*Pending]time.Time{}, ran: map[*Pending]int{}}
}

func (r *lateRuns) run(p *Pending) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at[p] = time.Now()
	r.ran[p]++
}

func (r *lateRuns) count(p *Pending) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ran[p]
}

// waitFor waits up to 5 s for p's lookup to run.
func (r *lateRuns) waitFor(t *testing.T, p *Pending) time.Time {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		r.mu.Lock()
		at, ok := r.at[p]
		r.mu.Unlock()
		if ok {
			return at
		}
	}
	t.Fatalf("the lookup of %s never ran", p.id)
	return time.Time{}
}

// TestLateVerdictsRunEachWaitOnceAfterItsTime: every queued wait runs its
// lookup once, none before its wait is over, also a wait queued while the
// timer is set for an earlier one; a cancelled one never runs, and the
// queue keeps no event once it is empty. Switch: cancel made to do
// nothing; the cancelled event's lookup runs.
func TestLateVerdictsRunEachWaitOnceAfterItsTime(t *testing.T) {
	const after = 30 * time.Millisecond
	runs := newLateRuns()
	q := newLateVerdicts(after, runs.run)
	a, b, c := &Pending{id: "a"}, &Pending{id: "b"}, &Pending{id: "c"}
	addedA := time.Now()
	q.add(a)
	tb := q.add(b)
	time.Sleep(after / 2)
	addedC := time.Now()
	q.add(c)
	q.cancel(b, tb)
	if at := runs.waitFor(t, a); at.Sub(addedA) < after {
		t.Errorf("a's lookup ran %v after it was queued, before its wait of %v", at.Sub(addedA), after)
	}
	if at := runs.waitFor(t, c); at.Sub(addedC) < after {
		t.Errorf("c's lookup ran %v after it was queued, before its wait of %v", at.Sub(addedC), after)
	}
	time.Sleep(3 * after)
	if n := runs.count(b); n != 0 {
		t.Errorf("the cancelled wait of b ran %d times", n)
	}
	for _, p := range []*Pending{a, c} {
		if n := runs.count(p); n != 1 {
			t.Errorf("%s's lookup ran %d times, want once", p.id, n)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waits) != 0 || q.armed {
		t.Errorf("after every wait ran: %d waits queued, timer set %v", len(q.waits), q.armed)
	}
}

// TestLateVerdictsStopRunsNothingMore: a client that closed runs no lookup
// still queued. Switch: stop without clearing the queue; the lookup runs
// when a later wait sets the timer again.
func TestLateVerdictsStopRunsNothingMore(t *testing.T) {
	const after = 20 * time.Millisecond
	runs := newLateRuns()
	q := newLateVerdicts(after, runs.run)
	a, b := &Pending{id: "a"}, &Pending{id: "b"}
	q.add(a)
	q.stop()
	q.add(b)
	runs.waitFor(t, b)
	time.Sleep(3 * after)
	if n := runs.count(a); n != 0 {
		t.Errorf("a's lookup, queued before stop, ran %d times", n)
	}
}
