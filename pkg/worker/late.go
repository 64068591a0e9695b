package worker

import (
	"sync"
	"time"
)

// lateVerdicts schedules the lookups of events whose receipts are late
// (Client.awaitVerdict). Every wait is ReceiptTimeout long, so waits end
// in the order they begin: the client keeps them in a queue and one timer
// for the oldest. A timer an event (time.AfterFunc) cost the SDK its
// allocation and two operations on the runtime's timer heap for every
// event, 4-6% of its CPU profile, though nearly every event gets its
// receipt long before.
type lateVerdicts struct {
	after time.Duration
	run   func(*Pending) // a lookup, started in a goroutine of its own

	mu sync.Mutex
	// waits are in the order they end; taken counts the waits ever taken
	// off its front, so that wait n is waits[n-taken].
	waits []lateWait
	taken uint64
	timer *time.Timer
	armed bool
}

// lateWait is one event's wait; p is nil once cancelled or run.
type lateWait struct {
	p  *Pending
	at time.Time
}

func newLateVerdicts(after time.Duration, run func(*Pending)) *lateVerdicts {
	return &lateVerdicts{after: after, run: run}
}

// add queues a lookup of p after the wait and returns its ticket, for
// cancel.
func (q *lateVerdicts) add(p *Pending) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	ticket := q.taken + uint64(len(q.waits))
	q.waits = append(q.waits, lateWait{p: p, at: time.Now().Add(q.after)})
	if !q.armed {
		q.armed = true
		if q.timer == nil {
			q.timer = time.AfterFunc(q.after, q.fire)
		} else {
			q.timer.Reset(q.after)
		}
	}
	return ticket
}

// cancel drops the lookup of ticket, p's, unless it ran: the queue then
// no longer holds p.
func (q *lateVerdicts) cancel(p *Pending, ticket uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ticket < q.taken {
		return
	}
	if i := ticket - q.taken; i < uint64(len(q.waits)) && q.waits[i].p == p {
		q.waits[i].p = nil
	}
}

// stop stops the timer; waits still queued never run.
func (q *lateVerdicts) stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.timer != nil {
		q.timer.Stop()
	}
	q.armed = false
	clear(q.waits)
	q.taken += uint64(len(q.waits))
	q.waits = q.waits[:0]
}

// fire runs the lookups whose waits ended and sets the timer for the next.
func (q *lateVerdicts) fire() {
	now := time.Now()
	var due []*Pending
	q.mu.Lock()
	if !q.armed {
		q.mu.Unlock()
		return
	}
	n := 0
	for n < len(q.waits) && !q.waits[n].at.After(now) {
		if p := q.waits[n].p; p != nil {
			due = append(due, p)
		}
		n++
	}
	clear(q.waits[:n])
	q.waits, q.taken = q.waits[n:], q.taken+uint64(n)
	if len(q.waits) > 0 {
		q.timer.Reset(q.waits[0].at.Sub(now))
	} else {
		q.armed, q.waits = false, q.waits[:0:0]
	}
	q.mu.Unlock()
	for _, p := range due {
		go q.run(p)
	}
}
