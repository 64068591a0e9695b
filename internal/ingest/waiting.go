package ingest

import (
	"sync"
	"time"
)

// waitingSet counts, per principal, the messages this process handed back to
// wait for an earlier version ("not yet"), until they come back or their
// redelivery is surely elsewhere. A principal at its cap gets no more waiting
// messages: the next one of its events that would wait is judged at once
// (gap, too_many_waiting). Without the cap one principal's events far ahead of
// their heads could fill the consumer's max_ack_pending for a whole gap
// window, and every other principal would wait with them.
type waitingSet struct {
	mu          sync.Mutex
	byPrincipal map[string]map[uint64]time.Time // source seq → forget after
	principalOf map[uint64]string
}

func newWaitingSet() *waitingSet {
	return &waitingSet{byPrincipal: map[string]map[uint64]time.Time{}, principalOf: map[uint64]string{}}
}

// reserve counts the message seq of principal as waiting until about until,
// unless principal already has max others waiting (false).
func (w *waitingSet) reserve(principal string, seq uint64, max int, until time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.byPrincipal[principal]
	if m == nil {
		m = map[uint64]time.Time{}
		w.byPrincipal[principal] = m
	}
	if _, ok := m[seq]; !ok && len(m) >= max {
		now := time.Now()
		for s, u := range m {
			if now.After(u) {
				delete(m, s)
				delete(w.principalOf, s)
			}
		}
		if len(m) >= max {
			return false
		}
	}
	m[seq] = until
	w.principalOf[seq] = principal
	return true
}

// back forgets the message seq: it was delivered again.
func (w *waitingSet) back(seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.principalOf[seq]
	if !ok {
		return
	}
	delete(w.principalOf, seq)
	if m := w.byPrincipal[h]; m != nil {
		delete(m, seq)
		if len(m) == 0 {
			delete(w.byPrincipal, h)
		}
	}
}
