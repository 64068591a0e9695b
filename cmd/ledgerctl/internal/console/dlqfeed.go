package console

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// dlqState follows LEDGER_DLQ: every dead letter stored from the start of
// the flow window on is counted by verdict and reason and handed to the
// views that list dead letters.
type dlqState struct {
	// seen is the last stream sequence read.
	seen    uint64
	subs    map[*dlqSub]struct{}
	problem string
}

func newDLQState() dlqState { return dlqState{subs: map[*dlqSub]struct{}{}} }

// dlqSub receives the dead letters stored after it subscribed. A
// subscriber that does not keep up loses letters and is told so by lost.
type dlqSub struct {
	ch   chan DeadLetter
	lost chan struct{}
}

// dlqSubBuffer is how many dead letters a subscriber may fall behind.
const dlqSubBuffer = 1024

// subscribeDLQ returns a subscription to new dead letters; cancel it when
// done.
func (h *hub) subscribeDLQ() (*dlqSub, func()) {
	s := &dlqSub{ch: make(chan DeadLetter, dlqSubBuffer), lost: make(chan struct{})}
	h.mu.Lock()
	h.dlq.subs[s] = struct{}{}
	h.mu.Unlock()
	return s, func() {
		h.mu.Lock()
		delete(h.dlq.subs, s)
		h.mu.Unlock()
	}
}

// followDLQ reads LEDGER_DLQ until ctx ends, starting again where it
// stopped after an error.
func (h *hub) followDLQ(ctx context.Context) {
	for ctx.Err() == nil {
		err := h.readDLQ(ctx)
		if ctx.Err() != nil {
			return
		}
		msg := h.problem("follow "+wire.StreamDLQ, "dead letters are not followed: "+wire.StreamDLQ+
			" could not be read (has the ingest created it? the console's log says why)", err)
		h.mu.Lock()
		h.dlq.problem = msg
		h.mu.Unlock()
		sleep(ctx, retryWait)
	}
}

// readDLQ reads the dead letters' headers (bodies are read when a letter
// is opened) with an ordered consumer: nothing is consumed.
func (h *hub) readDLQ(ctx context.Context) error {
	s, err := h.deps.JS.Stream(ctx, wire.StreamDLQ)
	if err != nil {
		return fmt.Errorf("open %s: %w", wire.StreamDLQ, err)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{h.deps.Subjects.DLQAll()}, HeadersOnly: true}
	h.mu.Lock()
	seen := h.dlq.seen
	h.mu.Unlock()
	if seen > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, seen+1
	} else {
		start := time.Now().Add(-h.cfg.FlowWindow)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	cons, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
	}
	defer it.Stop()
	h.mu.Lock()
	h.dlq.problem = ""
	h.mu.Unlock()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return ctx.Err()
			}
			return fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
		}
		d := h.deps.Ledger.DeadLetter(meta.Sequence.Stream, m.Subject(), m.Headers(), nil)
		h.letter(d, meta.Timestamp)
	}
}

// letter counts one dead letter and hands it to the subscribers.
func (h *hub) letter(d DeadLetter, stored time.Time) {
	at := stored
	if t, err := time.Parse(time.RFC3339Nano, d.RejectedAt); err == nil {
		at = t
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if d.Seq <= h.dlq.seen {
		return
	}
	h.dlq.seen = d.Seq
	if at.After(time.Now().Add(-h.cfg.FlowWindow)) {
		k := verdictReason{d.Verdict, d.Reason}
		s := h.flow.rejected[k]
		if s == nil {
			s = series{}
			h.flow.rejected[k] = s
		}
		s.add(at.Unix(), 1)
	}
	for sub := range h.dlq.subs {
		select {
		case sub.ch <- d:
		default:
			select {
			case <-sub.lost:
			default:
				close(sub.lost)
			}
		}
	}
}
