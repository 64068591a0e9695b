package ingest

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

type jsMsg = jetstream.Msg

// handle is the Consume callback: it routes a message to the lane of its
// partition, so that one partition's events are appended in arrival order.
func (s *Service) handle(m jetstream.Msg) {
	in := &inbound{msg: m}
	if meta, err := m.Metadata(); err == nil {
		in.sourceSeq, in.delivered = meta.Sequence.Stream, meta.NumDelivered
		in.event.Final = time.Since(meta.Timestamp) >= s.cfg.GapWindow
	}
	lane := 0
	if p, _, err := s.subjects.ParseIn(m.Subject()); err == nil {
		lane = p % len(s.lanes)
	}
	s.lanes[lane] <- in
}

// runLane takes batches off its channel until the channel is closed: the
// first message, then whatever arrives within BatchWait, up to BatchSize.
// Each batch is committed here and finished (copies stored, receipts sent,
// acks) by the lane's finisher, so that the next batch's append overlaps the
// previous batch's publish acks. The finisher takes batches in order, and at
// most finishQueue of them wait for it.
func (s *Service) runLane(ch <-chan *inbound) {
	defer s.wg.Done()
	done := make(chan *committedBatch, finishQueue)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for cb := range done {
			s.finish(cb)
		}
	}()
	defer func() { close(done); <-finished }()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		first, ok := <-ch
		if !ok {
			return
		}
		batch := append(make([]*inbound, 0, s.cfg.BatchSize), first)
		batch = drain(ch, batch, s.cfg.BatchSize)
		// Linger only when the lane was idle: a backlog already makes a
		// batch, and waiting would only add to its latency.
		if len(batch) == 1 {
			timer.Reset(s.cfg.BatchWait)
		fill:
			for len(batch) < s.cfg.BatchSize {
				select {
				case in, ok := <-ch:
					if !ok {
						break fill
					}
					batch = append(batch, in)
				case <-timer.C:
					break fill
				}
			}
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
		if cb := s.commit(batch); cb != nil {
			done <- cb
		}
	}
}

// drain appends what is already waiting on ch, up to max messages.
func drain(ch <-chan *inbound, batch []*inbound, max int) []*inbound {
	for len(batch) < max {
		select {
		case in, ok := <-ch:
			if !ok {
				return batch
			}
			batch = append(batch, in)
		default:
			return batch
		}
	}
	return batch
}

// finishQueue is how many committed batches of a lane may wait for their
// publish acks at once.
const finishQueue = 4

// committedBatch is a batch whose outcomes are durable in Postgres and whose
// LEDGER_LOG / LEDGER_DLQ copies are on their way.
type committedBatch struct {
	batch   []*inbound
	out     []*nats.Msg
	copies  *copySet
	started time.Time
}

// commit gives every message of the batch its outcome and sends the copies.
// The order of a batch's life is what makes "nothing lost" hold: commit in
// Postgres (here), then store the LEDGER_LOG and LEDGER_DLQ copies and wait
// for their acks, then send receipts, and only then ack the inbound messages
// (finish). A crash anywhere before the ack redelivers the message, and every
// step is idempotent.
func (s *Service) commit(batch []*inbound) *committedBatch {
	ctx := s.workCtx
	cb := &committedBatch{batch: batch, started: time.Now()}
	events := make([]fence.Event, 0, len(batch))
	pos := make([]int, 0, len(batch))
	for i, in := range batch {
		final := in.event.Final
		if decode(in, s.subjects) {
			in.event.Final = final
			events = append(events, in.event)
			pos = append(pos, i)
		}
	}
	if len(events) > 0 {
		results, ok := s.appendWithRetry(ctx, events, batch)
		if !ok {
			s.abandon(batch)
			return nil
		}
		for k, i := range pos {
			batch[i].result = results[k]
		}
	}
	// Log copies go out in commit order (a batch may hold a task's v2
	// before its v1; the fence commits v1 first), dead letters after them.
	var copies []*fence.Committed
	var letters []*nats.Msg
	for _, in := range batch {
		switch in.result.Verdict {
		case fence.NotYet:
		case wire.VerdictCommitted, wire.VerdictDuplicate:
			copies = append(copies, in.result.Committed)
		default:
			letters = append(letters, s.deadLetter(in))
		}
	}
	slices.SortFunc(copies, func(a, b *fence.Committed) int { return cmp.Compare(a.Seq, b.Seq) })
	for _, c := range copies {
		cb.out = append(cb.out, s.logCopy(c))
	}
	cb.out = append(cb.out, letters...)
	// A copy that fails here is published again by finish.
	cb.copies = s.copies.publish(cb.out)
	return cb
}

// finish waits until the batch's copies are stored, then sends receipts and
// acks (or, for events that wait for an earlier version, naks with a delay).
func (s *Service) finish(cb *committedBatch) {
	if !s.awaitCopies(s.workCtx, cb) {
		s.abandon(cb.batch)
		return
	}
	if h := s.cfg.hooks; h != nil && h.afterPublish != nil && !h.afterPublish() {
		return // a simulated crash: nothing acked
	}
	for _, in := range cb.batch {
		if in.result.Verdict == fence.NotYet {
			_ = in.msg.NakWithDelay(s.notYetDelay(in))
			continue
		}
		s.sendReceipt(in)
		if err := in.msg.Ack(); err != nil {
			s.log.Warn("ack failed; the message will be redelivered and get a duplicate verdict",
				slog.Uint64("source_seq", in.sourceSeq), slog.String("error", err.Error()))
		}
		s.metrics.verdict(in.result.Verdict, in.result.Reason)
	}
	s.metrics.batch(len(cb.batch), time.Since(cb.started))
}

// appendWithRetry calls fence.Append until it succeeds or the service stops.
// A failure is never a verdict: the batch stays in hand, its messages kept
// from redelivery by progress acks, while the database is away.
func (s *Service) appendWithRetry(ctx context.Context, events []fence.Event, batch []*inbound) ([]fence.Result, bool) {
	delay := s.cfg.RetryMin
	lastProgress := time.Now()
	for attempt := 1; ; attempt++ {
		res, err := s.store.Append(ctx, events)
		if err == nil {
			return res, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		s.metrics.retry("append")
		s.log.Warn("fenced append failed; retrying", slog.Int("events", len(events)), slog.Int("attempt", attempt),
			slog.Bool("transient", fence.IsTransient(err)), slog.Duration("backoff", delay), slog.String("error", err.Error()))
		if !s.wait(ctx, delay, batch, &lastProgress) {
			return nil, false
		}
		delay = min(delay*2, s.cfg.RetryMax)
	}
}

// awaitCopies waits for every publish ack of the batch's copies and
// publishes again the ones that failed, until all are stored or the service
// stops.
func (s *Service) awaitCopies(ctx context.Context, cb *committedBatch) bool {
	delay := s.cfg.RetryMin
	lastProgress := cb.started
	set := cb.copies
	for attempt := 1; ; attempt++ {
		failed, lastErr, ok := s.copies.wait(ctx, set, s.cfg.PublishTimeout)
		if !ok {
			return false
		}
		if len(failed) == 0 {
			return true
		}
		s.metrics.retry("publish")
		s.log.Warn("storing log/dead-letter copies failed; retrying", slog.Int("failed", len(failed)),
			slog.Int("attempt", attempt), slog.String("error", lastErr.Error()))
		if !s.wait(ctx, delay, cb.batch, &lastProgress) {
			return false
		}
		delay = min(delay*2, s.cfg.RetryMax)
		set = s.copies.publish(failed)
	}
}

// wait sleeps for d, sending progress acks for the batch so that JetStream
// does not redeliver it elsewhere while it is in hand.
func (s *Service) wait(ctx context.Context, d time.Duration, batch []*inbound, last *time.Time) bool {
	if time.Since(*last) > s.cfg.AckWait/3 {
		for _, in := range batch {
			_ = in.msg.InProgress()
		}
		*last = time.Now()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// abandon hands the batch back to JetStream for redelivery, at once.
func (s *Service) abandon(batch []*inbound) {
	for _, in := range batch {
		_ = in.msg.Nak()
	}
}

// notYetDelay is the redelivery delay of an event ahead of its head: it
// doubles with each delivery and never passes the end of the gap window by
// much, so the event is back for its gap verdict on time.
func (s *Service) notYetDelay(in *inbound) time.Duration {
	d := s.cfg.NotYetDelayMin
	for n := uint64(1); n < in.delivered && d < s.cfg.NotYetDelayMax; n++ {
		d *= 2
	}
	d = min(d, s.cfg.NotYetDelayMax)
	if meta, err := in.msg.Metadata(); err == nil {
		if left := s.cfg.GapWindow - time.Since(meta.Timestamp); left+time.Millisecond < d {
			d = max(left+time.Millisecond, time.Millisecond)
		}
	}
	return d
}

// logCopy is the LEDGER_LOG message of a committed event (CONTRACT §4).
// It is built with few allocations: at tens of thousands of copies a second
// they were a measurable share of the ingest's garbage. The header map is
// made at its final size, its values share one backing array, and the
// numbers are formatted into one buffer.
func (s *Service) logCopy(c *fence.Committed) *nats.Msg {
	var buf [80]byte
	nums := strconv.AppendInt(buf[:0], c.Seq, 10)
	seqEnd := len(nums)
	nums = strconv.AppendInt(nums, int64(c.Partition), 10)
	partEnd := len(nums)
	nums = strconv.AppendInt(nums, c.Version, 10)
	verEnd := len(nums)
	nums = strconv.AppendInt(nums, c.Generation, 10)
	numStr := string(nums)
	vals := [...]string{
		c.EventID,
		numStr[:seqEnd],
		c.Task,
		numStr[seqEnd:partEnd],
		numStr[partEnd:verEnd],
		c.Type,
		c.Holder,
		numStr[verEnd:],
		wire.FormatTime(c.CommittedAt),
	}
	v := vals[:] // one allocation for all nine values
	return &nats.Msg{
		Subject: s.subjects.Log(c.Partition, c.Task),
		Header: nats.Header{
			wire.HeaderMsgID:       v[0:1:1],
			wire.HeaderSeq:         v[1:2:2],
			wire.HeaderTask:        v[2:3:3],
			wire.HeaderPartition:   v[3:4:4],
			wire.HeaderVersion:     v[4:5:5],
			wire.HeaderType:        v[5:6:6],
			wire.HeaderHolder:      v[6:7:7],
			wire.HeaderGeneration:  v[7:8:8],
			wire.HeaderCommittedAt: v[8:9:9],
		},
		Data: c.Payload,
	}
}

// deadLetter is the LEDGER_DLQ copy of a rejected message (CONTRACT §5):
// the original body and headers plus the verdict.
func (s *Service) deadLetter(in *inbound) *nats.Msg {
	subject := s.subjects.DLQInvalid()
	if in.subjectOK {
		subject = s.subjects.DLQ(in.event.Partition, in.event.Task)
	}
	m := nats.NewMsg(subject)
	for k, vs := range in.msg.Headers() {
		// A publisher's expectations (Nats-Expected-Stream: LEDGER_IN, ...)
		// were about its own publish; carried over, they would make the
		// dead letter's publish fail for ever.
		if strings.HasPrefix(k, "Nats-Expected-") {
			continue
		}
		for _, v := range vs {
			m.Header.Add(k, v)
		}
	}
	r := in.result
	m.Header.Set(wire.HeaderVerdict, string(r.Verdict))
	m.Header.Set(wire.HeaderReason, r.Reason)
	if r.CurrentGeneration > 0 {
		m.Header.Set(wire.HeaderCurrentGeneration, strconv.FormatInt(r.CurrentGeneration, 10))
		m.Header.Set(wire.HeaderCurrentHolder, r.CurrentHolder)
	}
	m.Header.Set(wire.HeaderRejectedAt, wire.FormatTime(time.Now()))
	m.Header.Set(wire.HeaderSourceSeq, strconv.FormatUint(in.sourceSeq, 10))
	m.Data = in.msg.Data()
	return m
}

// sendReceipt tells the holder its event's verdict on core NATS. Receipts
// are at least once: a message redelivered after a crash gets a second
// (duplicate) receipt.
func (s *Service) sendReceipt(in *inbound) {
	if !wire.ValidID(in.event.Holder) {
		return
	}
	if err := s.nc.Publish(s.subjects.Receipt(in.event.Holder), receiptJSON(in)); err != nil {
		s.log.Warn("receipt not sent", slog.String("holder", in.event.Holder), slog.String("error", err.Error()))
	}
}

// receiptJSON encodes a wire.Receipt without reflection (one per event).
func receiptJSON(in *inbound) []byte {
	r := in.result
	b := make([]byte, 0, 256)
	b = append(b, `{"event_id":`...)
	b = appendJSONString(b, in.event.ID)
	b = append(b, `,"task":`...)
	b = appendJSONString(b, in.event.Task)
	b = append(b, `,"partition":`...)
	b = strconv.AppendInt(b, int64(in.event.Partition), 10)
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, in.event.Version, 10)
	b = append(b, `,"verdict":`...)
	b = appendJSONString(b, string(r.Verdict))
	b = append(b, `,"reason":`...)
	b = appendJSONString(b, r.Reason)
	b = append(b, `,"seq":`...)
	b = strconv.AppendInt(b, r.Seq, 10)
	b = append(b, `,"generation":`...)
	b = strconv.AppendInt(b, in.event.Generation, 10)
	b = append(b, `,"current_generation":`...)
	b = strconv.AppendInt(b, r.CurrentGeneration, 10)
	return append(b, '}')
}

// appendJSONString appends s as a JSON string. Ids, types and reasons are
// plain ASCII and are copied as they are; anything else (the id of an
// invalid message, say) goes through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
