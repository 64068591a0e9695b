package projector

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
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
	for {
		select {
		case <-s.stop:
			return
		case m := <-s.in:
			s.turn(ctx, s.fill([]jetstream.Msg{m}))
		case <-tick.C:
			s.turn(ctx, nil)
		case <-reconcile:
			s.reconcileTurn(ctx)
		}
	}
}

// fill adds what is waiting in the channel to batch, up to a batch's size.
// A full batch means the projector is behind: it goes on taking messages as
// they come, up to a catch-up batch, so that each task's versions in it
// cost one bucket write. It stops when none comes within CatchUpWait, and
// after ten times CatchUpWait in all.
func (s *Service) fill(batch []jetstream.Msg) []jetstream.Msg {
	for len(batch) < s.cfg.BatchSize {
		select {
		case m := <-s.in:
			batch = append(batch, m)
		default:
			return batch
		}
	}
	if len(batch) >= s.cfg.CatchUpBatchSize {
		return batch
	}
	// A steady flow must not hold the batch for long: ten waits in all.
	deadline := time.Now().Add(catchUpWaits * s.cfg.CatchUpWait)
	wait := time.NewTimer(s.cfg.CatchUpWait)
	defer wait.Stop()
	for len(batch) < s.cfg.CatchUpBatchSize {
		left := time.Until(deadline)
		if left <= 0 {
			return batch
		}
		select {
		case m := <-s.in:
			batch = append(batch, m)
			continue
		default:
		}
		wait.Reset(min(s.cfg.CatchUpWait, left)) // since Go 1.23 no stale tick survives a Reset
		select {
		case m := <-s.in:
			batch = append(batch, m)
		case <-wait.C:
			return batch
		case <-s.stop:
			return batch
		}
	}
	return batch
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
		for i, ev := range offered { // stopping: the batch goes to the next projector
			if ev.Task != "" {
				_ = batch[i].Nak()
			}
		}
		return
	}
	s.settle(batch, offered)
	s.observe(newest)
}

// offerBatch offers the event of each message. offered[i] is the event of
// batch[i], or has Task "" when that message is settled already; newest is
// the latest commit time among them.
func (s *Service) offerBatch(ctx context.Context, batch []jetstream.Msg, changed map[string]projection.State) (
	offered []projection.Event, newest time.Time) {
	offered = make([]projection.Event, len(batch))
	events := make([]projection.Event, len(batch))
	times := make([]time.Time, len(batch))
	for i, m := range batch {
		ev, committedAt, holder, err := decodeLog(s.subj, m.Subject(), m.Headers(), m.Data())
		if err != nil {
			// Only the ingest may publish to the log, and a redelivery
			// would not make this readable: it leaves the consumer, loudly.
			s.log.Error("undecodable message on the committed log; terminated", slog.String("subject", m.Subject()),
				slog.String("error", err.Error()))
			_ = m.Term()
			continue
		}
		events[i], times[i] = ev, committedAt
		s.writers[ev.Task] = wire.Principal(holder)
	}
	read := s.readAhead(ctx, events)
	for i, m := range batch {
		ev, committedAt := events[i], times[i]
		if ev.Task == "" { // terminated above
			continue
		}
		if err := s.offer(ctx, ev, changed, read); err != nil {
			s.log.Warn("loading a projection failed; the event is redelivered", slog.String("task", ev.Task),
				slog.Int64("version", ev.Version), slog.String("error", err.Error()))
			_ = m.NakWithDelay(s.redeliveryDelay(m))
			continue
		}
		offered[i] = ev
		if committedAt.After(newest) {
			newest = committedAt
		}
	}
	return offered, newest
}

// decodeLog reads a LEDGER_LOG message as an event, its commit time and holder,
// with the contract's codec. A version below 1 is refused here as well: the
// engine would refuse it too, and the copy would then be acked as handled.
func decodeLog(subj wire.Subjects, subject string, h nats.Header, data []byte) (projection.Event, time.Time, string, error) {
	c, err := subj.DecodeLog(subject, h, data)
	if err != nil {
		return projection.Event{}, time.Time{}, "", err
	}
	return eventOf(&c), c.CommittedAt, c.Holder, nil
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
func (s *Service) settle(batch []jetstream.Msg, offered []projection.Event) {
	for _, ev := range offered {
		if h := s.held[ev.Task]; h != nil {
			h.keep = max(h.keep, ev.Version)
		}
	}
	for i, ev := range offered {
		if ev.Task == "" {
			continue
		}
		if h := s.held[ev.Task]; h != nil && ev.Version == h.keep {
			_ = batch[i].NakWithDelay(h.delay)
			continue
		}
		_ = batch[i].Ack()
	}
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
