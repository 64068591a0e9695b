package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// A batch message (docs/contract.md §2, "Batches") carries several events
// of one partition. Its events go through the lanes one by one, each the
// single-event message it stands for (wire.DecodeBatch), so each gets the
// verdict, dead letter, log copy and row it would get sent alone. The
// message itself is acked once every event in it is acked, that is once
// every outcome is durable; if one event is handed back, the whole message
// is, once the others are done, and the redelivered events that were
// decided get the same verdict again (or duplicate).

// batchMsg is one LEDGER_IN batch message in hand.
type batchMsg struct {
	m jsMsg

	mu    sync.Mutex
	left  int  // events not yet acked or handed back
	nak   bool // an event was handed back: so is the message
	delay time.Duration
	// progress is when the message last got a progress ack, in Unix
	// nanoseconds: one per keep-alive tick, not one per event.
	progress atomic.Int64
}

// progressEvery is the least time between two progress acks of one batch
// message: the keep-alive visits each of its events within one tick.
const progressEvery = 10 * time.Millisecond

// done counts one event of b as acked (nak false) or handed back, and
// settles the message after its last event.
func (b *batchMsg) done(nak bool, delay time.Duration) error {
	b.mu.Lock()
	b.left--
	if nak {
		b.nak, b.delay = true, max(b.delay, delay)
	}
	last, handBack, d := b.left == 0, b.nak, b.delay
	b.mu.Unlock()
	switch {
	case !last:
		return nil
	case handBack && d > 0:
		return b.m.NakWithDelay(d)
	case handBack:
		return b.m.Nak()
	}
	return b.m.Ack()
}

// batchPart is one event of a batch message as a lane sees it: the
// single-event message it stands for, acked through its batch.
type batchPart struct {
	msg      *nats.Msg
	b        *batchMsg
	resolved atomic.Bool
}

var _ jetstream.Msg = (*batchPart)(nil)

func (p *batchPart) Metadata() (*jetstream.MsgMetadata, error) { return p.b.m.Metadata() }
func (p *batchPart) Data() []byte                              { return p.msg.Data }
func (p *batchPart) Headers() nats.Header                      { return p.msg.Header }
func (p *batchPart) Subject() string                           { return p.msg.Subject }
func (p *batchPart) Reply() string                             { return p.b.m.Reply() }
func (p *batchPart) Ack() error                                { return p.resolve(false, 0) }
func (p *batchPart) DoubleAck(context.Context) error           { return p.resolve(false, 0) }
func (p *batchPart) Nak() error                                { return p.resolve(true, 0) }
func (p *batchPart) NakWithDelay(d time.Duration) error        { return p.resolve(true, d) }
func (p *batchPart) Term() error                               { return p.resolve(false, 0) }
func (p *batchPart) TermWithReason(string) error               { return p.resolve(false, 0) }

// InProgress sends the batch message's progress ack, once per tick.
func (p *batchPart) InProgress() error {
	now := time.Now().UnixNano()
	last := p.b.progress.Load()
	if now-last < int64(progressEvery) || !p.b.progress.CompareAndSwap(last, now) {
		return nil
	}
	return p.b.m.InProgress()
}

// resolve settles the event once: a second ack or hand-back of the same
// event changes nothing.
func (p *batchPart) resolve(nak bool, d time.Duration) error {
	if !p.resolved.CompareAndSwap(false, true) {
		return nil
	}
	return p.b.done(nak, d)
}

// badBatch is a batch message that does not decode: it is judged whole,
// invalid/bad_batch, and the events whose ids can be read get receipts.
type badBatch struct {
	inv    *wire.Invalid
	holder string
	ids    []string
}

// routeBatch hands a batch message's events to the partition's lane, in
// order, or the message whole when it does not decode.
func (s *Service) routeBatch(m jetstream.Msg, p int) {
	d, bad := s.subjects.DecodeBatch(m.Subject(), m.Headers(), m.Data())
	base := inbound{received: time.Now(), part: p}
	if meta, err := m.Metadata(); err == nil {
		base.stream, base.sourceSeq, base.delivered, base.published = meta.Stream, meta.Sequence.Stream, meta.NumDelivered, meta.Timestamp
	}
	if bad != nil {
		in := base
		in.msg, in.bad = m, &badBatch{inv: bad, holder: d.Holder, ids: d.IDs}
		s.enqueue(&in)
		return
	}
	if h := s.cfg.hooks; h != nil && h.batchAckOnReceive {
		_ = m.Ack()
	}
	b := &batchMsg{m: m, left: len(d.Events)}
	for i, em := range d.Events {
		in := base
		in.msg = &batchPart{msg: em, b: b}
		if !s.enqueue(&in) {
			// Stopping: the rest goes back with it.
			for _, rest := range d.Events[i+1:] {
				_ = (&batchPart{msg: rest, b: b}).Nak()
			}
			return
		}
	}
}

// sendBatchReceipts sends the receipts of parts, events of batch messages
// in finish's order, one message per batch message, and then acks each.
func (s *Service) sendBatchReceipts(parts []*inbound) {
	for len(parts) > 0 {
		b := parts[0].msg.(*batchPart).b
		n := 1
		for n < len(parts) && parts[n].msg.(*batchPart).b == b {
			n++
		}
		group := parts[:n]
		parts = parts[n:]
		holder := group[0].event.Holder
		if wire.ValidHolder(holder) {
			rs := make([]wire.Receipt, len(group))
			for i, in := range group {
				rs[i] = receiptOf(in)
			}
			if err := s.nc.PublishMsg(s.subjects.ReceiptsMsg(holder, rs)); err != nil {
				s.log.Warn("receipts not sent", slog.String("holder", holder), slog.String("error", err.Error()))
			}
		}
		for _, in := range group {
			s.ack(in)
			s.metrics.verdict(in.result.Verdict, in.result.Reason, in.result.WouldReject)
		}
	}
}

// sendBadBatchReceipts tells the holder of a batch that does not decode
// its verdict, for each event id that can be read.
func (s *Service) sendBadBatchReceipts(in *inbound) {
	bb := in.bad
	if !wire.ValidHolder(bb.holder) || len(bb.ids) == 0 {
		return
	}
	rs := make([]wire.Receipt, len(bb.ids))
	for i, id := range bb.ids {
		rs[i] = wire.Receipt{EventID: id, Partition: in.part, Verdict: wire.VerdictInvalid, Reason: bb.inv.Reason}
	}
	if err := s.nc.PublishMsg(s.subjects.ReceiptsMsg(bb.holder, rs)); err != nil {
		s.log.Warn("receipts not sent", slog.String("holder", bb.holder), slog.String("error", err.Error()))
	}
}

// decodeBad gives a batch that does not decode its invalid verdict; its
// dead letter goes to <prefix>.dlq.invalid, as it has no task.
func decodeBad(in *inbound) {
	in.subjectOK = false
	in.event = fence.Event{Holder: in.bad.holder, Partition: in.part}
	in.result = fence.Result{Verdict: wire.VerdictInvalid, Reason: in.bad.inv.Reason, Detail: in.bad.inv.Detail}
}

// earlierBatch reports whether an inbox holds a batch message of in's
// partition stored before in (queuedBefore). Its tasks are not known
// without reading it, so it counts as "maybe": it delays a gap verdict,
// never causes one.
func (s *Service) earlierBatch(ctx context.Context, in *inbound) (bool, error) {
	return s.queuedBefore(ctx, in, s.subjects.InBatchPartition(in.event.Partition))
}

// firstOf is the sequence of the inbox stream's first message on subject
// (a filter); found is false when it has none.
func (s *Service) firstOf(ctx context.Context, stream, subject string) (seq uint64, found bool, err error) {
	st := s.inboxes.stream(stream)
	if st == nil {
		return 0, false, nil
	}
	first, err := st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return first.Sequence, true, nil
}
