package projector

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// run takes the delivered messages in batches, and turns with an empty
// batch on every tick so that due re-fetches and held tasks are not left
// waiting for traffic. ctx is the service's work context.
func (s *Service) run(ctx context.Context) {
	defer close(s.done)
	defer s.giveBack()
	tick := time.NewTicker(s.cfg.RefetchEvery)
	defer tick.Stop()
	reconcile, stopReconcile := s.reconcileTicker()
	defer stopReconcile()
	var next *inMsg // taken from the channel, for the next turn
	defer func() {
		if next != nil {
			_ = s.take(*next).Nak()
		}
	}()
	for {
		if next != nil { // a backlog: the timers are looked at between turns
			select {
			case <-s.stop:
				return
			case <-reconcile:
				s.reconcileTurn(ctx)
				continue
			default:
			}
			var batch []jetstream.Msg
			batch, next = s.fill(*next)
			s.turn(ctx, batch)
			continue
		}
		select {
		case <-s.stop:
			return
		case in := <-s.in:
			var batch []jetstream.Msg
			batch, next = s.fill(in)
			s.turn(ctx, batch)
		case <-tick.C:
			s.turn(ctx, nil)
		case <-reconcile:
			s.reconcileTurn(ctx)
		}
	}
}

// fill is a turn's batch, and the message it had no room for if any (the
// next turn's first): first and what is waiting in the channel, up to
// a batch's size in events (inqueue.go). A full batch means the projector
// is behind: it goes on taking messages as they come, up to a catch-up
// batch, so that each task's versions in it cost one bucket write. It stops
// when none comes within CatchUpWait, and after ten times CatchUpWait in
// all. A message that would take the batch past its size starts the next
// one instead, unless the batch is empty.
func (s *Service) fill(first inMsg) (batch []jetstream.Msg, next *inMsg) {
	batch, events := []jetstream.Msg{s.take(first)}, first.events
	add := func(in inMsg) bool {
		if events+in.events > s.cfg.CatchUpBatchSize {
			next = &in
			return false
		}
		batch, events = append(batch, s.take(in)), events+in.events
		return true
	}
	for events < s.cfg.BatchSize {
		select {
		case in := <-s.in:
			if !add(in) {
				return batch, next
			}
		default:
			return batch, next
		}
	}
	// A steady flow must not hold the batch for long: ten waits in all.
	deadline := time.Now().Add(catchUpWaits * s.cfg.CatchUpWait)
	wait := time.NewTimer(s.cfg.CatchUpWait)
	defer wait.Stop()
	for events < s.cfg.CatchUpBatchSize {
		left := time.Until(deadline)
		if left <= 0 {
			return batch, next
		}
		select {
		case in := <-s.in:
			if !add(in) {
				return batch, next
			}
			continue
		default:
		}
		wait.Reset(min(s.cfg.CatchUpWait, left)) // since Go 1.23 no stale tick survives a Reset
		select {
		case in := <-s.in:
			if !add(in) {
				return batch, next
			}
		case <-wait.C:
			return batch, next
		case <-s.stop:
			return batch, next
		}
	}
	return batch, next
}

// catchUpWaits bounds how long a catch-up turn collects messages, in
// CatchUpWaits.
const catchUpWaits = 10

// turn handles one batch (possibly empty), the due re-fetches and the held
// tasks that are due.
func (s *Service) turn(ctx context.Context, batch []jetstream.Msg) {
	changed := map[string]projection.State{}
	offered, newest := s.offerBatch(ctx, batch, changed)
	s.refetch(ctx, changed)
	s.retryHeld(changed)
	if !s.writeAll(ctx, changed) {
		for i, o := range offered { // stopping: the batch goes to the next projector
			if !o.settled {
				_ = batch[i].Nak()
			}
		}
		return
	}
	s.settle(batch, offered)
	s.observe(newest)
}

// offeredMsg is what became of a log message in a turn: its events, all
// offered to the engine, or settled already (terminated as undecodable, or
// handed back because a task of it could not be loaded).
type offeredMsg struct {
	events  []projection.Event
	settled bool
}

// offerBatch offers the events of each message: a per-event copy's one, or
// a log batch's several (wire.DecodeLogCopies). offered[i] is what became
// of batch[i]; newest is the latest commit time among the events offered.
func (s *Service) offerBatch(ctx context.Context, batch []jetstream.Msg, changed map[string]projection.State) (
	offered []offeredMsg, newest time.Time) {
	offered = make([]offeredMsg, len(batch))
	// One array for every message's events, and one for their commit
	// times: a turn of per-event copies makes no allocation per message.
	all := make([]projection.Event, 0, len(batch))
	times := make([]time.Time, 0, len(batch))
	ends := make([]int, len(batch))
	for i, m := range batch {
		copies, err := s.subj.DecodeLogCopies(m.Subject(), m.Headers(), m.Data())
		if err != nil {
			// Only the ingest may publish to the log, and a redelivery
			// would not make this readable: it leaves the consumer, loudly.
			s.log.Error("undecodable message on the committed log; terminated", slog.String("subject", m.Subject()),
				slog.String("error", err.Error()))
			_ = m.Term()
			offered[i].settled = true
		}
		for k := range copies {
			all, times = append(all, eventOf(&copies[k])), append(times, copies[k].CommittedAt)
			s.writers[copies[k].Task] = wire.Principal(copies[k].Holder)
		}
		ends[i] = len(all)
	}
	for i := range batch {
		from := 0
		if i > 0 {
			from = ends[i-1]
		}
		offered[i].events = all[from:ends[i]:ends[i]]
	}
	read := s.readAhead(ctx, all)
	for i, m := range batch {
		if offered[i].settled {
			continue
		}
		from := ends[i] - len(offered[i].events)
		for k, ev := range offered[i].events {
			if err := s.offer(ctx, ev, changed, read); err != nil {
				// The message comes back whole: its events offered
				// already are duplicates then.
				s.log.Warn("loading a projection failed; the event is redelivered", slog.String("task", ev.Task),
					slog.Int64("version", ev.Version), slog.String("error", err.Error()))
				_ = m.NakWithDelay(s.redeliveryDelay(m))
				offered[i].settled = true
				break
			}
			if at := times[from+k]; at.After(newest) {
				newest = at
			}
		}
	}
	return offered, newest
}

// eventOf is the engine's event of a committed event, as the log copy and
// the archive's files (rebuild.go) carry it.
func eventOf(c *wire.LogCopy) projection.Event {
	return projection.Event{Task: c.Task, Partition: c.Partition, Version: c.Version, Seq: c.Seq,
		Type: c.Type, Payload: c.Payload, Snapshot: c.Snapshot}
}

// offer gives one event to the engine, loading the task the first time
// (from what read holds of it, if anything), and records the task's new
// state if it changed. It fails only if the task could not be loaded: then
// the event was not offered at all.
func (s *Service) offer(ctx context.Context, ev projection.Event, changed map[string]projection.State, read readAhead) error {
	res, err := s.engine.Offer(ev)
	if errors.Is(err, projection.ErrNotLoaded) {
		rewrite, lerr := s.load(ctx, ev.Task, read)
		if lerr != nil {
			s.metrics.loadFailures.Inc()
			return lerr
		}
		if rewrite {
			changed[ev.Task], _ = s.engine.State(ev.Task)
		}
		res, err = s.engine.Offer(ev)
	}
	s.metrics.outcome(res.Outcome)
	switch {
	case errors.Is(err, projection.ErrConflict):
		s.log.Error("conflicting content for a committed version; not applied", slog.String("task", ev.Task),
			slog.Int64("version", ev.Version), slog.Int64("seq", ev.Seq))
	case err != nil:
		s.log.Warn("event not applied; it will be read again", slog.String("task", ev.Task),
			slog.Int64("version", ev.Version), slog.String("error", err.Error()))
	}
	if res.Changed {
		changed[ev.Task] = res.State
	}
	return nil
}

// redeliveryDelay spaces the redeliveries of a message that could not be
// handled: RetryMin, doubling with each delivery up to RetryMax.
func (s *Service) redeliveryDelay(m jetstream.Msg) time.Duration {
	d := s.cfg.RetryMin
	if meta, err := m.Metadata(); err == nil {
		for n := uint64(1); n < meta.NumDelivered && d < s.cfg.RetryMax; n++ {
			d *= 2
		}
	}
	return min(d, s.cfg.RetryMax)
}

// settle acks the offered messages once their effects are stored. A held
// task keeps the message of its newest version unacked: if this process
// dies, that message alone brings the task back (a version past the stored
// one opens a gap that is re-fetched), so the older ones need not wait too.
// A log batch kept for one held task brings its other events back too, as
// duplicates.
func (s *Service) settle(batch []jetstream.Msg, offered []offeredMsg) {
	for _, o := range offered {
		if o.settled {
			continue
		}
		for _, ev := range o.events {
			if h := s.held[ev.Task]; h != nil {
				h.keep = max(h.keep, ev.Version)
			}
		}
	}
	for i, o := range offered {
		if o.settled {
			continue
		}
		if d, keep := s.kept(o.events); keep {
			_ = batch[i].NakWithDelay(d)
			continue
		}
		_ = batch[i].Ack()
	}
}

// kept reports whether a message with events holds a held task's newest
// version, and the task's delay: such a message stays unacked.
func (s *Service) kept(events []projection.Event) (time.Duration, bool) {
	for _, ev := range events {
		if h := s.held[ev.Task]; h != nil && ev.Version == h.keep {
			return h.delay, true
		}
	}
	return 0, false
}

// observe updates the gauges and lets the engine shed idle tasks.
func (s *Service) observe(newest time.Time) {
	s.trim()
	st := s.engine.Stats()
	s.metrics.openGaps.Set(float64(st.Waiting))
	s.metrics.buffered.Set(float64(st.Buffered))
	s.metrics.tasksInMem.Set(float64(st.Tasks))
	s.metrics.heldTasks.Set(float64(len(s.held)))
	if !newest.IsZero() {
		s.metrics.lag.Set(time.Since(newest).Seconds())
	}
	var oldest time.Time
	for _, since := range s.gaps {
		if oldest.IsZero() || since.Before(oldest) {
			oldest = since
		}
	}
	if oldest.IsZero() {
		s.metrics.oldestGap.Set(0)
	} else {
		s.metrics.oldestGap.Set(time.Since(oldest).Seconds())
	}
}

// trim lets the engine evict idle tasks and forgets what the service keeps
// about exactly those: a resident task's revision must stay, or its next
// compare-and-set fails. A held task keeps its revision: its state is still
// to be written.
func (s *Service) trim() {
	for _, task := range s.engine.Trim() {
		if s.held[task] == nil {
			delete(s.revs, task)
		}
		delete(s.oversized, task)
	}
}
