package worker

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// A lease sends its events in batches (docs/contract.md §2, "Batches"): the
// events published within Config.BatchLinger of each other leave in one
// LEDGER_IN message, up to Config.BatchMax events and Config.BatchMaxBytes.
// The server stores, delivers and acks one message rather than one per
// event. Each event is kept until its verdict exactly as when sent alone:
// its own Pending, receipt and lookup. A batch whose publish fails is sent
// again event by event, as single messages. A ledger older than batches has
// no stream subject for them; its "no response from stream" turns batching
// off for the client's life, and the events go alone.

// batcher gathers one lease's events into batch messages.
type batcher struct {
	mu     sync.Mutex
	ps     []*Pending
	events []wire.Inbound
	bytes  int
	// gen counts the batches begun: a linger timer flushes only its own.
	gen uint64
}

// batchOverhead is an element's JSON beyond its payload, task and type,
// with room to spare.
const batchOverhead = 128

// add puts p, whose message is in, into the lease's batch, and sends the
// batch when it is full; the first event of a batch starts its linger.
func (l *Lease) add(p *Pending, in wire.Inbound) {
	b, cfg := &l.batch, l.c.cfg
	size := len(in.Payload) + len(in.Task) + len(in.Type) + batchOverhead
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.ps) > 0 && b.bytes+size > cfg.BatchMaxBytes {
		l.flushLocked()
	}
	b.ps, b.events, b.bytes = append(b.ps, p), append(b.events, in), b.bytes+size
	switch {
	case len(b.ps) >= cfg.BatchMax || b.bytes >= cfg.BatchMaxBytes:
		l.flushLocked()
	case len(b.ps) == 1:
		gen := b.gen
		time.AfterFunc(cfg.BatchLinger, func() { l.flush(gen) })
	}
}

// flush sends batch gen if it is still gathering.
func (l *Lease) flush(gen uint64) {
	l.batch.mu.Lock()
	defer l.batch.mu.Unlock()
	if l.batch.gen == gen && len(l.batch.ps) > 0 {
		l.flushLocked()
	}
}

// flushLocked sends the batch gathered so far; l.batch.mu is held, so
// batches leave in order. One event goes as a batch of one too: the
// ingest reads a partition's batches and single messages with a consumer
// each, so a task whose versions went in both forms would have a later
// one wait for an earlier one the other consumer holds. Only an event
// larger than BatchMaxBytes goes as a single message.
func (l *Lease) flushLocked() {
	b, c := &l.batch, l.c
	ps, events, bytes := b.ps, b.events, b.bytes
	b.ps, b.events, b.bytes = nil, nil, 0
	b.gen++
	if isClosed(c.closedCh) {
		return // Close gave every event waiting for its ack ErrClosed
	}
	if !c.batching() || (len(ps) == 1 && bytes >= c.cfg.BatchMaxBytes) {
		for _, p := range ps {
			c.sendAlone(p)
		}
		return
	}
	m, err := c.subj.BatchMsg(events)
	if err == nil {
		c.mu.Lock()
		c.batches[m.Header.Get(wire.HeaderMsgID)] = ps
		c.mu.Unlock()
		_, err = c.js.PublishMsgAsync(m)
		if err == nil {
			return
		}
		c.takeBatch(m)
	}
	c.batchFailed(ps, err)
}

// sendAlone publishes p's own message, as when batches are off.
func (c *Client) sendAlone(p *Pending) {
	if _, err := c.js.PublishMsgAsync(p.message()); err != nil {
		if c.takeAckingID(p.id) != nil {
			go c.republish(p, err)
		}
	}
}

// batching reports whether the client sends batches.
func (c *Client) batching() bool { return c.cfg.BatchMax > 1 && !c.noBatches.Load() }

// takeBatch removes and returns the events of a batch message sent.
func (c *Client) takeBatch(m *nats.Msg) []*Pending {
	id := m.Header.Get(wire.HeaderMsgID)
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := c.batches[id]
	delete(c.batches, id)
	return ps
}

// onBatchAck is onAck for a batch message: each event has its ack.
func (c *Client) onBatchAck(m *nats.Msg, ack *jetstream.PubAck) {
	for _, p := range c.takeBatch(m) {
		if c.takeAckingID(p.id) != nil {
			p.setAck(ack, nil)
			c.awaitVerdict(p)
			c.wg.Done()
		}
	}
}

// batchFailed sends each event of a batch whose publish failed again on
// its own. A stream without batch subjects turns batching off.
func (c *Client) batchFailed(ps []*Pending, err error) {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		if !c.noBatches.Swap(true) {
			c.log.Info("LEDGER_IN takes no batches (a ledger older than them): sending events one by one",
				slog.String("error", err.Error()))
		}
	}
	for _, p := range ps {
		if c.takeAckingID(p.id) != nil {
			go c.republish(p, err)
		}
	}
}

// onBatchReceipt settles the events of a batched receipt.
func (c *Client) onBatchReceipt(m *nats.Msg) {
	rs, err := wire.DecodeReceipts(m.Data)
	if err != nil {
		c.log.Warn("undecodable receipts", slog.String("error", err.Error()))
	}
	for _, r := range rs {
		if !c.settle(r) {
			c.log.Debug("receipt of no pending event", slog.String("event_id", r.EventID),
				slog.String("verdict", string(r.Verdict)))
		}
	}
}
