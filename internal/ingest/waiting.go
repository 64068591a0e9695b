package ingest

import (
	"sync"
	"time"
)

// waitingSet counts, per holder, the messages this process handed back to
// wait for an earlier version ("not yet"), until they come back or their
// redelivery is surely elsewhere. A holder at its cap gets no more waiting
// messages: the next one of its events that would wait is judged at once
// (gap, too_many_waiting). Without the cap one holder's events far ahead of
// their heads could fill the consumer's max_ack_pending for a whole gap
// window, and every other holder would wait with them.
type waitingSet struct {
	mu       sync.Mutex
	byHolder map[string]map[uint64]time.Time // source seq → forget after
	holderOf map[uint64]string
}

func newWaitingSet() *waitingSet {
	return &waitingSet{byHolder: map[string]map[uint64]time.Time{}, holderOf: map[uint64]string{}}
}

// reserve counts the message seq of holder as waiting until about until,
// unless holder already has max others waiting (false).
func (w *waitingSet) reserve(holder string, seq uint64, max int, until time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.byHolder[holder]
	if m == nil {
		m = map[uint64]time.Time{}
		w.byHolder[holder] = m
	}
	if _, ok := m[seq]; !ok && len(m) >= max {
		now := time.Now()
		for s, u := range m {
			if now.After(u) {
				delete(m, s)
				delete(w.holderOf, s)
			}
		}
		if len(m) >= max {
			return false
		}
	}
	m[seq] = until
	w.holderOf[seq] = holder
	return true
}

// back forgets the message seq: it was delivered again.
func (w *waitingSet) back(seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.holderOf[seq]
	if !ok {
		return
	}
	delete(w.holderOf, seq)
	if m := w.byHolder[h]; m != nil {
		delete(m, seq)
		if len(m) == 0 {
			delete(w.byHolder, h)
		}
	}
}
