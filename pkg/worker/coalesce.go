package worker

import "sync"

// coalescer gathers calls into requests, for every publisher of a client:
// a call that arrives while a request is in flight waits for the next one,
// which carries every call that arrived meanwhile. An idle client asks at
// once, a busy one once per round trip instead of once per call. take
// says how many of the waiting calls the next request carries (at least
// one while any wait), and ask sends them and settles each.
type coalescer[C any] struct {
	take func(wait []C) int
	ask  func(calls []C)

	mu   sync.Mutex
	wait []C
	busy bool // a request is in flight; new calls wait for the next one
}

// add queues call, and starts sending requests unless one is in flight.
func (q *coalescer[C]) add(call C) {
	q.mu.Lock()
	q.wait = append(q.wait, call)
	start := !q.busy
	q.busy = true
	q.mu.Unlock()
	if start {
		go q.run()
	}
}

// run sends requests while calls wait, then goes idle.
func (q *coalescer[C]) run() {
	for {
		q.mu.Lock()
		n := q.take(q.wait)
		if n == 0 {
			q.wait, q.busy = nil, false
			q.mu.Unlock()
			return
		}
		calls := q.wait[:n:n]
		q.wait = q.wait[n:]
		q.mu.Unlock()
		q.ask(calls)
	}
}
