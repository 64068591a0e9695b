package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

type jsMsg = jetstream.Msg

// runLane takes batches off its channel until the channel is closed: the
// first message, then whatever arrives within BatchWait, up to BatchSize.
// Each batch is committed here and finished (copies stored, receipts sent,
// acks) by the lane's finisher, so that the next batch's append overlaps the
// previous batch's publish acks. The finisher takes batches in order, and at
// most finishQueue of them wait for it.
func (s *Service) runLane(l *lane) {
	ch := l.ch
	defer s.wg.Done()
	done := make(chan *committedBatch, finishQueue)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for cb := range done {
			s.finish(l, cb)
		}
	}()
	defer func() { close(done); <-finished }()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	tick := time.NewTicker(s.cfg.NotYetDelayMin)
	defer tick.Stop()
	for {
		var first *inbound
		if len(l.ready) > 0 {
			first, l.ready = l.ready[0], l.ready[1:]
		} else {
			select {
			case first = <-ch:
			case now := <-tick.C:
				l.due(now)
				continue
			case <-s.stopping:
				// Finish what is queued; Stop hands back whatever comes later.
				select {
				case first = <-ch:
				default:
					return
				}
			}
		}
		b := batcher{max: s.cfg.BatchSize, maxBytes: s.cfg.MaxBatchBytes, batch: make([]*inbound, 0, s.cfg.BatchSize)}
		b.add(first)
		for len(l.ready) > 0 && !b.full() {
			b.add(l.ready[0])
			l.ready = l.ready[1:]
		}
		b.drain(ch)
		// Linger only when the lane was idle: a backlog already makes a
		// batch, and waiting would only add to its latency.
		if len(b.batch) == 1 {
			timer.Reset(s.cfg.BatchWait)
		fill:
			for !b.full() {
				select {
				case in := <-ch:
					b.add(in)
				case <-timer.C:
					break fill
				case <-s.stopping:
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
		if cb := s.commit(l, b.batch); cb != nil {
			done <- cb
		}
	}
}

// lane is the queue of one share of the partitions.
type lane struct {
	ch chan *inbound
	// stored is, per task, the highest version whose LEDGER_LOG copy this
	// lane stored, and where; only the lane's finisher uses it.
	stored map[string]storedCopy
	// chains is, per partition, what the lane knows of its log batches
	// (logchain.go); only the lane's finisher uses it.
	chains map[int]chain
	// epoch is the NATS client's reconnect count stored was kept in
	// (logtail.go); a reconnect clears stored.
	epoch uint64
	// parked holds, per task, the events waiting for an earlier version,
	// by version; ready, those offered again before the channel's. Only
	// the lane's own loop uses them (park.go).
	parked  map[string][]*inbound
	nParked int
	ready   []*inbound
}

// batcher gathers one batch: up to max messages, and no more once their
// bodies reach maxBytes. The byte bound keeps a batch of large events short:
// a batch holds its lease rows locked until it commits, and a takeover
// waits for it.
type batcher struct {
	batch         []*inbound
	max, maxBytes int
	bytes         int
}

func (b *batcher) add(in *inbound) {
	b.batch = append(b.batch, in)
	b.bytes += len(in.msg.Data())
}

func (b *batcher) full() bool { return len(b.batch) >= b.max || b.bytes >= b.maxBytes }

// drain adds what is already waiting on ch, until the batch is full.
func (b *batcher) drain(ch <-chan *inbound) {
	for !b.full() {
		select {
		case in := <-ch:
			b.add(in)
		default:
			return
		}
	}
}

// finishQueue is how many committed batches of a lane may wait for their
// copies to be stored at once.
const finishQueue = 4

// committedBatch is a batch whose outcomes are durable in Postgres and whose
// LEDGER_LOG / LEDGER_DLQ copies are to be stored.
type committedBatch struct {
	batch  []*inbound         // the events with a verdict: receipts and acks
	size   int                // the events the batch began with
	logged []*fence.Committed // the events whose copies out begins with, in commit order
	// fresh are the batch's commits and duplicates, in commit order, when
	// they go to LEDGER_LOG as log batches (logchain.go) rather than in
	// logged; epochs are the claim epochs of their partitions.
	fresh  []*fence.Committed
	epochs map[int]int64
	out    []*nats.Msg
	// started is when the batch began, decided when its outcomes were
	// known and its copies built (its finisher may wait for others').
	started, decided time.Time
	// lettersStored marks the dead letters (out after its log copies)
	// stored so far; a letter without a Nats-Msg-Id would be stored twice.
	lettersStored []bool
}

// letterStored reports whether the batch's k-th dead letter is stored.
func (cb *committedBatch) letterStored(k int) bool {
	return k < len(cb.lettersStored) && cb.lettersStored[k]
}

// commit gives every message of the batch its outcome. The order of a
// batch's life is what makes "nothing lost" hold: commit in Postgres (here),
// then store the LEDGER_LOG and LEDGER_DLQ copies and wait for their acks,
// then send receipts, and only then ack the inbound messages (finish). A
// crash anywhere before the ack redelivers the message, and every step is
// idempotent.
func (s *Service) commit(l *lane, batch []*inbound) *committedBatch {
	ctx := s.workCtx
	cb := &committedBatch{size: len(batch), started: time.Now()}
	s.metrics.queued(batch, cb.started)
	batch = s.ownedOnly(batch)
	pos := make([]int, 0, len(batch))
	for i, in := range batch {
		if decode(in, s.subjects) {
			pos = append(pos, i)
		}
	}
	s.markFinal(ctx, batch, pos, cb.started)
	if h := s.cfg.hooks; h != nil && h.beforeAppend != nil {
		h.beforeAppend(ctx)
	}
	for len(pos) > 0 {
		events := make([]fence.Event, len(pos))
		parts := make([]int, 0, 4)
		for k, i := range pos {
			events[k] = batch[i].event
			if !slices.Contains(parts, batch[i].part) {
				parts = append(parts, batch[i].part)
			}
		}
		claims, _ := s.claims.epochs(parts)
		cb.epochs = claims.Epochs
		appendStart := time.Now()
		results, err := s.appendWithRetry(ctx, claims, events)
		s.metrics.stages(stageAppend, time.Since(appendStart), len(events))
		if errors.Is(err, fence.ErrNotClaimed) {
			// Another ingest took a partition of the batch over: learn
			// which, and decide the rest.
			s.beat()
			batch = s.ownedOnly(batch)
			pos = pos[:0]
			for i, in := range batch {
				if in.subjectOK && in.result.Verdict == "" {
					pos = append(pos, i)
				}
			}
			continue
		}
		if err != nil {
			s.abandon(batch)
			return nil
		}
		for k, i := range pos {
			batch[i].result = results[k]
		}
		break
	}
	s.settleWaiting(l, batch, cb.started)
	// Log copies go out in commit order (a batch may hold a task's v2
	// before its v1; the fence commits v1 first), dead letters after them.
	var copies []*fence.Committed
	var letters []*nats.Msg
	for _, in := range batch {
		switch in.result.Verdict {
		case fence.NotYet:
			continue
		case wire.VerdictCommitted, wire.VerdictDuplicate:
			if s.cfg.LogBatches {
				cb.fresh = append(cb.fresh, in.result.Committed)
			} else {
				copies = append(copies, in.result.Committed)
			}
		default:
			letters = append(letters, s.deadLetter(in))
		}
		cb.batch = append(cb.batch, in)
	}
	bySeq := func(a, b *fence.Committed) int { return cmp.Compare(a.Seq, b.Seq) }
	slices.SortFunc(copies, bySeq)
	slices.SortFunc(cb.fresh, bySeq)
	cb.logged = copies
	for _, c := range copies {
		cb.out = append(cb.out, s.logCopy(c))
	}
	cb.out = append(cb.out, letters...)
	cb.decided = time.Now()
	return cb
}

// ownedOnly returns the events of batch whose partition this process still
// decides; the others are handed back, for their partition's new owner.
func (s *Service) ownedOnly(batch []*inbound) []*inbound {
	keep := batch[:0]
	for _, in := range batch {
		if s.claims.owns(in.part) {
			keep = append(keep, in)
			continue
		}
		s.unpark(in)
		if s.held.release(in) {
			_ = in.msg.Nak()
		}
	}
	return keep
}

// settleWaiting parks the batch's events that are not yet due and offers
// again the waiting events its commits made due. An event whose principal
// has too many waiting already is handed back for redelivery later.
func (s *Service) settleWaiting(l *lane, batch []*inbound, now time.Time) {
	heads := map[string]int64{}
	for _, in := range batch {
		if in.result.Verdict == fence.NotYet {
			if !s.park(l, in, now) {
				s.metrics.refused("waiting", wire.Principal(in.event.Holder), "quota")
				s.held.release(in)
				_ = in.msg.NakWithDelay(s.notYetDelay(in, now))
			}
			continue
		}
		s.unpark(in)
		if c := in.result.Committed; c != nil && c.Version > heads[c.Task] {
			heads[c.Task] = c.Version
		}
	}
	for task, head := range heads {
		l.wake(task, head)
	}
}

// markFinal decides which events of the batch may be judged gap if their
// version is still ahead of the head: the ones whose gap window has closed
// (counted from when JetStream stored them), unless LEDGER_IN still holds an
// earlier message of the same task. Such a message is a predecessor that
// was published and acknowledged before the event and has no verdict yet
// (it waits in a crashed or paused ingest until AckWait hands it on, or in a
// queue while the database was away): judging the event now would turn a
// fault into a verdict.
func (s *Service) markFinal(ctx context.Context, batch []*inbound, pos []int, now time.Time) {
	var check []*inbound
	for _, i := range pos {
		in := batch[i]
		if !in.published.IsZero() && now.Sub(in.published) >= s.cfg.GapWindow {
			check = append(check, in)
		}
	}
	if len(check) == 0 {
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, in := range check {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			in.event.Final = !s.earlierPending(ctx, in)
		}()
	}
	wg.Wait()
}

// earlierPending reports whether an inbox holds a message of in's task,
// from any holder, that was stored before in, or whether that cannot be
// told now: a fault is never turned into a verdict.
func (s *Service) earlierPending(ctx context.Context, in *inbound) bool {
	if h := s.cfg.hooks; h != nil && h.noEarlierCheck {
		return false
	}
	if in.sourceSeq == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	// Any holder's: the predecessor may be a previous holder's. Not even
	// in itself (another copy of it was acked, or it came in a batch): a
	// batch may still hold its predecessor.
	earlier, err := s.queuedBefore(ctx, in, s.subjects.InTask(in.event.Partition, in.event.Task))
	switch {
	case err != nil:
		s.log.Warn("cannot tell whether an earlier version is still queued; the gap verdict waits",
			slog.Uint64("source_seq", in.sourceSeq), slog.String("error", err.Error()))
		return true
	case earlier:
		return true
	}
	if h := s.cfg.hooks; h != nil && h.noBatchGapCheck {
		return false
	}
	earlier, err = s.earlierBatch(ctx, in)
	if err != nil {
		s.log.Warn("cannot tell whether an earlier batch is still queued; the gap verdict waits",
			slog.Uint64("source_seq", in.sourceSeq), slog.String("error", err.Error()))
	}
	return earlier
}

// queuedBefore reports whether an inbox stream holds a message on filter
// stored before in: in in's own stream, one of a lower sequence; in
// another inbox (a principal's own), one stored at an earlier time, as two
// streams' sequences do not compare.
func (s *Service) queuedBefore(ctx context.Context, in *inbound, filter string) (bool, error) {
	own := cmp.Or(in.stream, wire.StreamIn)
	for _, name := range s.inboxes.names() {
		st := s.inboxes.stream(name)
		if st == nil {
			continue
		}
		first, err := st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(filter))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			continue
		case err != nil:
			return true, fmt.Errorf("%s: %w", name, err)
		case name == own && first.Sequence < in.sourceSeq, name != own && first.Time.Before(in.published):
			return true, nil
		}
	}
	return false, nil
}

// finish stores the batch's copies, then sends receipts and acks (or, for
// events that wait for an earlier version, naks with a delay). A lane's
// batches are finished one after another, so a batch's copies are
// published only once every earlier batch's copies are stored: a copy
// published again after a 503 or a reconnect is never overtaken by a later
// commit of its task.
func (s *Service) finish(l *lane, cb *committedBatch) {
	copiesStart := time.Now()
	s.metrics.stages(stageHandoff, copiesStart.Sub(cb.decided), len(cb.batch))
	if len(cb.fresh) > 0 && !s.storeLinks(s.workCtx, l, cb) {
		s.abandon(cb.batch)
		return
	}
	if !s.storeCopies(s.workCtx, l, cb) {
		s.abandon(cb.batch)
		return
	}
	s.metrics.stages(stageCopies, time.Since(copiesStart), len(cb.batch))
	if h := s.cfg.hooks; h != nil && h.afterPublish != nil && !h.afterPublish() {
		return // a simulated crash: nothing acked
	}
	var parts []*inbound
	now := time.Now()
	for _, in := range cb.batch {
		if !s.held.release(in) {
			continue // its partition was handed over meanwhile
		}
		if !in.published.IsZero() && in.result.Verdict.Final() {
			s.metrics.stage(stageReceipt, now.Sub(in.published)) // counted before it is sent
		}
		if _, ok := in.msg.(*batchPart); ok {
			parts = append(parts, in) // receipts and acks per batch message, below
			continue
		}
		s.sendReceipt(in)
		s.ack(in)
		s.metrics.verdict(in.result.Verdict, in.result.Reason, in.result.WouldReject)
	}
	s.sendBatchReceipts(parts)
	s.metrics.batch(cb.size, time.Since(cb.started))
}

// appendFailingLogEvery is how often a run of failed appends is logged
// again while it lasts.
const appendFailingLogEvery = 30 * time.Second

// appendWithRetry appends under claims until it succeeds, the service
// stops (an error), or a claim is found gone (fence.ErrNotClaimed). A
// failure is never a verdict: the batch stays in hand, its messages kept
// from redelivery by progress acks, while the database is away. Each run
// of failures is logged once, with its cause, every 30 s while it lasts,
// and once more when it ends.
func (s *Service) appendWithRetry(ctx context.Context, claims *fence.Claims, events []fence.Event) ([]fence.Result, error) {
	delay := s.cfg.RetryMin
	var failedSince, loggedAt time.Time
	for attempt := 1; ; attempt++ {
		// Nothing commits on a database that forgot acknowledged commits,
		// and a reconnect is checked before its first append.
		err := s.verify(ctx, false)
		var res []fence.Result
		if err == nil {
			res, err = s.store.AppendClaimed(ctx, claims, events)
			if h := s.cfg.hooks; err == nil && h != nil && h.loseAppendAnswer != nil && h.loseAppendAnswer() {
				err = errors.New("test: the append's answer was lost")
			}
		}
		if err == nil || errors.Is(err, fence.ErrNotClaimed) {
			if !failedSince.IsZero() {
				s.log.Info("fenced append works again", slog.Int("attempts", attempt),
					slog.String("after", time.Since(failedSince).Round(time.Millisecond).String()))
			}
			return res, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		s.metrics.retry("append")
		switch {
		case failedSince.IsZero():
			failedSince, loggedAt = time.Now(), time.Now()
			s.log.Warn("fenced append failed; retrying until it works", slog.Int("events", len(events)),
				slog.Bool("transient", fence.IsTransient(err)), slog.String("error", err.Error()))
		case time.Since(loggedAt) >= appendFailingLogEvery:
			// A run that lasts says so, with its newest cause: the first
			// one may be long gone.
			loggedAt = time.Now()
			s.log.Warn("fenced append still failing; retrying until it works", slog.Int("attempts", attempt),
				slog.String("for", time.Since(failedSince).Round(time.Second).String()), slog.String("error", err.Error()))
		}
		if !s.sleep(ctx, delay) {
			return nil, ctx.Err()
		}
		delay = min(delay*2, s.cfg.RetryMax)
	}
}

// storeCopies publishes the batch's copies and waits for their publish
// acks, publishing again the ones that failed, until all are stored or the
// service stops. A dead letter refused for its size is published again
// without its body: no single message can wedge the lane. After NATS
// reconnected, or the stream refused a copy for a predecessor it lacks, it
// starts over with the whole batch, the copies before it looked up again:
// the server may have lost copies it had acked.
func (s *Service) storeCopies(ctx context.Context, l *lane, cb *committedBatch) bool {
	expect := s.cfg.hooks == nil || !s.cfg.hooks.noLogExpectations
	delay := s.cfg.RetryMin
	for refused := 0; ; {
		plan, ok := s.withPreceding(ctx, l, cb)
		if !ok {
			return false
		}
		stored, again, wrongLast := s.publishCopies(ctx, l, cb, plan, expect)
		if !again {
			return stored
		}
		if !wrongLast {
			continue
		}
		// The first refusal is looked up again at once. A lookup can be
		// answered by a replica behind the leader (LEDGER_LOG allows
		// direct gets), so the next ones wait, longer each time. A put-back
		// deduplicated against a copy the stream lost would be refused for
		// ever: after logRefusalsMax rounds the copies go without the check,
		// in order still, as before a loss could be seen.
		if refused++; refused == logRefusalsMax {
			s.log.Warn("LEDGER_LOG keeps refusing log copies for their predecessors; storing them without the check",
				slog.Int("rounds", refused))
			expect = false
		}
		if refused > 1 {
			if !s.sleep(ctx, delay) {
				return false
			}
			delay = min(delay*2, s.cfg.RetryMax)
		}
	}
}

// logRefusalsMax is how many rounds of one batch's copies may be refused
// for a predecessor the stream lacks before they go without the check.
const logRefusalsMax = 5

// withPreceding is the batch's copies after the earlier ones LEDGER_LOG
// lacks (precedingCopies), retried until they are known.
func (s *Service) withPreceding(ctx context.Context, l *lane, cb *committedBatch) ([]plannedCopy, bool) {
	delay := s.cfg.RetryMin
	for attempt := 1; ; attempt++ {
		s.forgetStored(l)
		before, looked, err := s.precedingCopies(ctx, l, cb.logged)
		if err == nil {
			return planCopies(l, before, looked, cb, s.logCopy, s.cfg.hooks != nil && s.cfg.hooks.oneRound), true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		s.metrics.retry("log_order")
		s.log.Warn("cannot tell which earlier log copies are missing; retrying", slog.Int("attempt", attempt),
			slog.String("error", err.Error()))
		if !s.sleep(ctx, delay) {
			return nil, false
		}
		delay = min(delay*2, s.cfg.RetryMax)
	}
}

// publishCopies stores plan in rounds: each round publishes every copy not
// stored yet whose task's first copy in the plan is stored. Copies that failed are
// published again. again reports that NATS reconnected meanwhile, or that
// the stream refused a copy's expectation (wrongLast; the lane forgot its
// task): the caller starts over.
func (s *Service) publishCopies(ctx context.Context, l *lane, cb *committedBatch, plan []plannedCopy, expect bool) (
	stored, again, wrongLast bool) {
	delay := s.cfg.RetryMin
	for attempt := 1; ; {
		var round []int
		for i := range plan {
			p := &plan[i]
			if p.stored || (p.after >= 0 && !plan[p.after].stored) {
				continue
			}
			if p.task != "" {
				setExpectation(p, expect)
			}
			round = append(round, i)
		}
		if len(round) == 0 {
			l.remember(plan)
			return true, false, false
		}
		msgs := make([]*nats.Msg, len(round))
		for k, i := range round {
			msgs[k] = plan[i].msg
		}
		set := s.copies.publish(msgs)
		failed, lastErr, ok := s.copies.wait(ctx, set, s.cfg.PublishTimeout)
		if !ok {
			return false, false, false
		}
		for k, i := range round {
			p := &plan[i]
			p.stored, p.seq = set.outcome(k)
			if p.stored && p.letter >= 0 {
				if cb.lettersStored == nil {
					cb.lettersStored = make([]bool, len(cb.out)-len(cb.logged))
				}
				cb.lettersStored[p.letter] = true
			}
		}
		if len(failed) == 0 {
			delay = s.cfg.RetryMin
			continue // the next round: copies whose predecessors are stored now
		}
		var inFlight bool
		wrongLast, inFlight = refusals(failed)
		if wrongLast {
			l.remember(plan)
			s.metrics.retry("log_order")
			s.log.Warn("LEDGER_LOG lacks the copy before a new one (a replica lost its tail?); looking its tasks up again",
				slog.String("error", lastErr.Error()))
			for _, p := range plan {
				if p.task != "" && !p.stored {
					delete(l.stored, p.task)
				}
			}
			return false, true, true
		}
		if inFlight {
			// A clustered stream checks an expectation only once the
			// subject's last message is applied; it will be in a moment.
			if !s.sleep(ctx, time.Millisecond) {
				return false, false, false
			}
			continue
		}
		for i, f := range failed {
			if isTooLarge(f.err) && f.msg.Header.Get(wire.HeaderVerdict) != "" {
				failed[i].msg = s.shrinkLetter(f.msg)
			}
		}
		shrunk := make(map[*nats.Msg]*nats.Msg, len(failed))
		for _, f := range failed {
			shrunk[f.orig] = f.msg
		}
		for _, i := range round {
			if m, ok := shrunk[plan[i].msg]; ok {
				plan[i].msg = m
			}
		}
		s.metrics.retry("publish")
		s.log.Warn("storing log/dead-letter copies failed; retrying", slog.Int("failed", len(failed)),
			slog.Int("attempt", attempt), slog.String("error", lastErr.Error()))
		if !s.sleep(ctx, delay) {
			return false, false, false
		}
		if s.reconnected(l) {
			return false, true, false
		}
		delay = min(delay*2, s.cfg.RetryMax)
		attempt++
	}
}

// setExpectation sets or clears a log copy's
// Nats-Expected-Last-Subject-Sequence (planCopies): only a task's first
// copy in the plan carries one.
func setExpectation(p *plannedCopy, expect bool) {
	if !expect || p.after >= 0 || !p.known {
		p.msg.Header.Del(jetstream.ExpectedLastSubjSeqHeader)
		return
	}
	p.msg.Header[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(p.expect, 10)}
}

// sleep waits for d, or until the service stops working (false). The
// batch in hand keeps its progress acks meanwhile (heldSet).
func (s *Service) sleep(ctx context.Context, d time.Duration) bool {
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
		s.held.release(in)
		_ = in.msg.Nak()
	}
}

// notYetDelay is the redelivery delay of an event ahead of its head: it
// doubles with each delivery and never passes the end of the gap window by
// much, so the event is back for its gap verdict on time.
func (s *Service) notYetDelay(in *inbound, now time.Time) time.Duration {
	d := s.cfg.NotYetDelayMin
	for n := uint64(1); n < in.delivered && d < s.cfg.NotYetDelayMax; n++ {
		d *= 2
	}
	d = min(d, s.cfg.NotYetDelayMax)
	if !in.published.IsZero() {
		if left := s.cfg.GapWindow - now.Sub(in.published); left+time.Millisecond < d {
			d = max(left+time.Millisecond, time.Millisecond)
		}
	}
	return d
}

// logCopy is the LEDGER_LOG message of a committed event (docs/contract.md §4).
func (s *Service) logCopy(c *fence.Committed) *nats.Msg { return s.subjects.LogMsg(c) }

// deadLetter is the LEDGER_DLQ copy of a rejected message (docs/contract.md §5),
// made to fit the stream (wire.DeadLetterMsg).
func (s *Service) deadLetter(in *inbound) *nats.Msg {
	subject := s.subjects.DLQInvalid()
	if in.subjectOK {
		subject = s.subjects.DLQ(in.event.Partition, in.event.Task)
	}
	r := in.result
	m := wire.DeadLetterMsg(subject, in.msg.Subject(), in.msg.Headers(), in.msg.Data(), wire.Rejection{
		Verdict: r.Verdict, Reason: r.Reason, CurrentGeneration: r.CurrentGeneration, CurrentHolder: r.CurrentHolder,
		RejectedAt: time.Now(), SourceSeq: in.sourceSeq}, s.letterMax)
	// One principal's letters must not push everyone else's out of the
	// stream (it drops its oldest when full): beyond its quota a letter
	// keeps the verdict and loses the message's body and headers.
	hb, _ := wire.HeaderSize(m.Header)
	if principal := principalOfSubject(in.msg.Subject()); !s.letters.Take(principal, hb+len(m.Data)) {
		s.metrics.refused("dead_letter", principal, "quota")
		return wire.DeadLetterWithoutOriginal(m)
	}
	return m
}

// shrinkLetter is a dead letter the stream refused for its size (its limit
// was lowered under us): the same letter without a body.
func (s *Service) shrinkLetter(m *nats.Msg) *nats.Msg {
	s.log.Error("a dead letter was refused for its size; storing it without its body",
		slog.String("subject", m.Subject), slog.Int("body_bytes", len(m.Data)))
	return wire.DeadLetterWithoutBody(m)
}

// sendReceipt tells the holder its event's verdict on core NATS. Receipts
// are at least once: a message redelivered after a crash gets a second
// (duplicate) receipt.
func (s *Service) sendReceipt(in *inbound) {
	if in.bad != nil {
		s.sendBadBatchReceipts(in)
		return
	}
	if !wire.ValidHolder(in.event.Holder) {
		return
	}
	if err := s.nc.Publish(s.subjects.Receipt(in.event.Holder), receiptJSON(in)); err != nil {
		s.log.Warn("receipt not sent", slog.String("holder", in.event.Holder), slog.String("error", err.Error()))
	}
}

// receiptJSON is the receipt of in's verdict.
func receiptJSON(in *inbound) []byte {
	r := receiptOf(in)
	return wire.AppendReceipt(make([]byte, 0, 256), &r)
}

// receiptOf is the receipt of in's verdict.
func receiptOf(in *inbound) wire.Receipt {
	r := in.result
	return wire.Receipt{EventID: in.event.ID, Task: in.event.Task,
		Partition: in.event.Partition, Version: in.event.Version, Verdict: r.Verdict, Reason: r.Reason, Seq: r.Seq,
		Generation: in.event.Generation, CurrentGeneration: r.CurrentGeneration, FenceMode: r.FenceMode, WouldReject: r.WouldReject}
}
