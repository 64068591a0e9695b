package ingest

import (
	"sync"
	"time"
)

// heldSet is every LEDGER_IN message this process has been handed and has
// not yet acked or handed back: queued for its lane, in a batch, or waiting
// for its copies. A ticker sends each of them a progress ack well within
// AckWait, so that JetStream never redelivers a message elsewhere while it
// is in hand here, whatever holds it up (a database outage, a full lane, a
// slow publish). Only a process that stops sending them (crashed, paused,
// cut off) lets its messages go to another ingest, after AckWait.
type heldSet struct {
	mu     sync.Mutex
	msgs   map[*inbound]struct{}
	byPart map[int]int
	// off is a test seam: progress acks are not sent.
	off bool
}

func newHeldSet() *heldSet { return &heldSet{msgs: map[*inbound]struct{}{}, byPart: map[int]int{}} }

func (h *heldSet) add(in *inbound) {
	h.mu.Lock()
	if _, ok := h.msgs[in]; !ok {
		h.msgs[in] = struct{}{}
		h.byPart[in.part]++
	}
	h.mu.Unlock()
}

// release forgets in: it was acked, or handed back. It is false if in was
// not held (another path released it first).
func (h *heldSet) release(in *inbound) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.msgs[in]; !ok {
		return false
	}
	delete(h.msgs, in)
	if h.byPart[in.part]--; h.byPart[in.part] == 0 {
		delete(h.byPart, in.part)
	}
	return true
}

// count is how many messages of partition p are held.
func (h *heldSet) count(p int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byPart[p]
}

func (h *heldSet) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.msgs)
}

// snapshot returns the messages held now.
func (h *heldSet) snapshot() []*inbound {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*inbound, 0, len(h.msgs))
	for in := range h.msgs {
		out = append(out, in)
	}
	return out
}

// keepAlive sends a progress ack for every held message each interval
// until stop is closed.
func (h *heldSet) keepAlive(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if h.off {
				continue
			}
			for _, in := range h.snapshot() {
				_ = in.msg.InProgress()
			}
		}
	}
}
