package projector

import (
	"strconv"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// Log messages wait for the run loop, and fill a turn, by their events: a
// per-event copy is one, a log batch as many as it holds (up to
// wire.MaxBatch). Counted in messages, a turn of log batches and the queue
// before it held up to a thousand times what the configuration says, and
// a backlog of batches overflowed the consumer's client buffer (nats.go
// drops what passes 64 MiB of a subscription's pending messages, and a
// dropped message waits out the ack wait): the catch-up stalled for 30 s
// at a time (ledgerlab bench -log-batches).

// PullMaxBytes bounds the bytes the consumer's pulls keep buffered in the
// client: well under nats.go's 64 MiB slow-consumer limit of a
// subscription, and 16 of LEDGER_LOG's largest messages (1 MiB).
const PullMaxBytes = 16 << 20

// inMsg is a delivered log message and its weight in events.
type inMsg struct {
	m      jetstream.Msg
	events int
}

// weight is how many events m holds, as its header says: a log batch's
// Ledger-Batch, 1 for anything else. A header out of range weighs 1 (the
// message is refused when it is decoded).
func (s *Service) weight(m jetstream.Msg) int {
	if !s.subj.IsLogBatch(m.Subject()) {
		return 1
	}
	n, err := strconv.Atoi(m.Headers().Get(wire.HeaderBatch))
	if err != nil || n < 1 || n > wire.MaxBatch {
		return 1
	}
	return n
}

// inQueue bounds the events delivered to the run loop and not yet taken
// by it. A message heavier than the bound goes alone.
type inQueue struct {
	mu     sync.Mutex
	room   sync.Cond
	queued int
	max    int
	closed bool
}

func newInQueue(max int) *inQueue {
	q := &inQueue{max: max}
	q.room.L = &q.mu
	return q
}

// reserve waits for room for events; false once the queue is closed.
func (q *inQueue) reserve(events int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.queued > 0 && q.queued+events > q.max && !q.closed {
		q.room.Wait()
	}
	if q.closed {
		return false
	}
	q.queued += events
	return true
}

// release gives back the room of a message the run loop took.
func (q *inQueue) release(events int) {
	q.mu.Lock()
	q.queued -= events
	q.mu.Unlock()
	q.room.Broadcast()
}

// close wakes every delivery waiting for room, for good.
func (q *inQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.room.Broadcast()
}

// take is a message the run loop took from s.in, its room given back.
func (s *Service) take(in inMsg) jetstream.Msg {
	s.queue.release(in.events)
	return in.m
}
