package worker

import "sync"

// signal is a channel that is closed once, made only when something waits
// on it. An event has three (its receipt, its publish ack, its version),
// and a worker that waits for receipts in publish order finds nearly all of
// them closed already: making and closing three channels an event was a
// seventh of the SDK's CPU (bench -external -worker-profile).
type signal struct {
	mu     sync.Mutex
	ch     chan struct{}
	closed bool
}

// closedChan is the channel wait returns once a signal is closed.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// wait returns a channel that is closed when s is.
func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return closedChan
	}
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// close closes s; closing it again does nothing.
func (s *signal) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	if s.ch != nil {
		close(s.ch)
	}
}

// isClosed reports whether s is closed.
func (s *signal) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}
