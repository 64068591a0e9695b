package ingest

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// An event whose version is ahead of its task's head waits here, in its
// lane, held (progress acks keep it from redelivery), until the version
// before it commits. This process alone decides its partitions, in stream
// order, so the missing version can only come through this lane: the
// commit that moves the head offers the waiting versions again at once,
// the run of them that now follows the head in one batch. A timer offers a
// waiting event again anyway (NotYetDelayMin doubling to NotYetDelayMax),
// and once its gap window has closed, for its gap verdict.

// parkedCount counts, per principal, the events waiting in every lane.
// A principal at MaxWaitingPerPrincipal parks no more: its next early
// event is handed back to JetStream for redelivery later, never judged for
// it. So memory stays bounded, and no principal's events wait in another's
// place: a partition's consumer delivers its holder's events only.
type parkedCount struct {
	mu sync.Mutex
	by map[string]int
}

func (c *parkedCount) take(principal string, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by[principal] >= max {
		return false
	}
	c.by[principal]++
	return true
}

func (c *parkedCount) give(principal string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by[principal]--; c.by[principal] <= 0 {
		delete(c.by, principal)
	}
}

// park keeps in, an event that is not yet due, in the lane; false if its
// principal is at its cap (the caller hands it back instead).
func (s *Service) park(l *lane, in *inbound, now time.Time) bool {
	if in.parkedAt.IsZero() {
		if !s.parked.take(wire.Principal(in.event.Holder), s.cfg.MaxWaitingPerPrincipal) {
			return false
		}
		in.parkedAt = now
	}
	d := s.cfg.NotYetDelayMin
	for n := now.Sub(in.parkedAt); d < s.cfg.NotYetDelayMax && n > d; {
		d *= 2
	}
	d = min(d, s.cfg.NotYetDelayMax)
	in.retryAt = now.Add(d)
	if !in.published.IsZero() {
		if end := in.published.Add(s.cfg.GapWindow + time.Millisecond); end.Before(in.retryAt) && end.After(now) {
			in.retryAt = end
		}
	}
	task := in.event.Task
	q := append(l.parked[task], in)
	slices.SortStableFunc(q, func(a, b *inbound) int { return cmp.Compare(a.event.Version, b.event.Version) })
	l.parked[task] = q
	l.nParked++
	return true
}

// unpark takes in out of the lane's waiting events' count.
func (s *Service) unpark(in *inbound) {
	if !in.parkedAt.IsZero() {
		s.parked.give(wire.Principal(in.event.Holder))
		in.parkedAt, in.retryAt = time.Time{}, time.Time{}
	}
}

// wake moves to the lane's ready queue the waiting events of task that now
// follow its head: versions up to head + 1 and the run after it.
func (l *lane) wake(task string, head int64) {
	q := l.parked[task]
	if len(q) == 0 {
		return
	}
	next := head + 1
	k := 0
	for ; k < len(q) && q[k].event.Version <= next; k++ {
		if q[k].event.Version == next {
			next++
		}
	}
	if k == 0 {
		return
	}
	l.ready = append(l.ready, q[:k]...)
	l.nParked -= k
	if k == len(q) {
		delete(l.parked, task)
	} else {
		l.parked[task] = slices.Clone(q[k:])
	}
}

// due moves to the ready queue every waiting event whose retry time came.
func (l *lane) due(now time.Time) {
	if l.nParked == 0 {
		return
	}
	for task, q := range l.parked {
		keep := q[:0]
		for _, in := range q {
			if now.Before(in.retryAt) {
				keep = append(keep, in)
				continue
			}
			l.ready = append(l.ready, in)
			l.nParked--
		}
		if len(keep) == 0 {
			delete(l.parked, task)
		} else {
			l.parked[task] = keep
		}
	}
}
