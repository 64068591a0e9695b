package effect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// Effect is one committed intent, as the Handler gets it.
type Effect struct {
	// ID is the event id: the idempotency key to pass downstream. Every
	// delivery of the intent carries the same one.
	ID string
	// Task, Partition, Version and Type place the intent in the ledger.
	Task      string
	Partition int
	Version   int64
	Type      string
	// Payload is the intent's JSON payload.
	Payload []byte
	// Fence is the fence the intent was committed under: who decided it.
	Fence wire.Fence
	// Seq is the intent's position in the ledger's log.
	Seq int64
	// CommittedAt is the database clock's time of the commit.
	CommittedAt time.Time
	// Delivery counts the deliveries of the intent to this consumer,
	// starting at 1; above 1, an earlier call may have taken effect.
	Delivery uint64
}

// Handler performs one effect. It returns nil once the effect is done
// downstream; any error gets the effect delivered again after
// Config.RetryDelay. It must pass e.ID downstream as the idempotency key,
// since it is called at least once per intent. ctx ends when the runner
// stops.
type Handler func(ctx context.Context, e Effect) error

// Runner consumes committed intents from LEDGER_LOG and calls a Handler
// for each. Create one with New, then Start and Stop it.
type Runner struct {
	js  jetstream.JetStream
	cfg Config
	h   Handler
	log *slog.Logger
	sub wire.Subjects

	mu     sync.Mutex
	cc     jetstream.ConsumeContext
	cancel context.CancelFunc
	// kept is closed once keep, which consumes again after the client
	// stopped consuming, has returned.
	kept chan struct{}
	// handling is held while a delivery is handled (Consume calls one at
	// a time), so Stop can wait for the one in progress.
	handling sync.Mutex
	// partly is what handle did of log batches whose delivery failed
	// part way; only handle uses it, under handling.
	partly partlyDone
}

// New checks cfg and returns a runner that is not yet started.
func New(js jetstream.JetStream, cfg Config, h Handler) (*Runner, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if js == nil || h == nil {
		return nil, fmt.Errorf("effect: a JetStream context and a handler are required: %w", ErrInvalidConfig)
	}
	return &Runner{js: js, cfg: cfg, h: h, log: cfg.Logger, sub: wire.Subjects{Prefix: cfg.Prefix}}, nil
}

// Consumer is the name of the runner's durable consumer on LEDGER_LOG:
// effects-<Config.Name>.
func (r *Runner) Consumer() string { return "effects-" + r.cfg.Name }

func (r *Runner) consumerConfig() jetstream.ConsumerConfig {
	filters := []string{r.sub.LogAll()}
	if len(r.cfg.Partitions) > 0 {
		filters = filters[:0]
		for _, p := range r.cfg.Partitions {
			filters = append(filters, r.sub.LogPartition(p))
		}
	}
	return jetstream.ConsumerConfig{
		Durable:        r.Consumer(),
		Description:    "ledger effect runner " + r.cfg.Name + ": committed intents of " + fmt.Sprint(r.cfg.Types),
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        r.cfg.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  r.cfg.MaxAckPending,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PinnedTTL:      r.cfg.PinnedTTL,
		PriorityGroups: []string{priorityGroup},
	}
}

// priorityGroup is the one priority group of a runner's consumer.
const priorityGroup = "effects"

// Start creates or updates the runner's durable consumer and begins
// consuming. It returns once the runner is pulling; whether it is the
// active runner or a standby is the server's choice (see the package
// documentation). LEDGER_LOG must exist (the ingest creates it).
//
// Until Stop, the runner keeps consuming: when the client gives up on the
// consumer (the server answered that it was deleted, or refused a pull,
// or it no longer has it after a loss of its storage), the runner logs it
// and makes the consumer again, from the ack floor the server kept or, if
// the consumer is gone, from the start of LEDGER_LOG (the handler's
// idempotency key makes that a repeat).
func (r *Runner) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cc != nil {
		return ErrStarted
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cc, endAcks, err := r.consume(ctx, hctx)
	if err != nil {
		cancel()
		return err
	}
	r.cc, r.cancel = cc, cancel
	r.kept = make(chan struct{})
	go r.keep(hctx, cc, endAcks, r.kept)
	return nil
}

// consume makes the runner's consumer (or takes the one there) and
// consumes it; handlers get hctx. Waits for the server to confirm an ack
// end when endAcks is called: once this consuming has ended, no
// confirmation is coming (an ack that reached the server as the consumer
// was deleted is never answered), and a handle waiting for one would hold
// up the deliveries of the consumer made again.
func (r *Runner) consume(ctx, hctx context.Context) (cc jetstream.ConsumeContext, endAcks context.CancelFunc, err error) {
	cons, err := r.js.CreateOrUpdateConsumer(ctx, wire.StreamLog, r.consumerConfig())
	if err != nil {
		return nil, nil, fmt.Errorf("effect: create consumer %s on %s: %w", r.Consumer(), wire.StreamLog, err)
	}
	actx, endAcks := context.WithCancel(hctx)
	cc, err = cons.Consume(func(m jetstream.Msg) { r.handle(hctx, actx, m) },
		jetstream.PullPriorityGroup(priorityGroup),
		jetstream.PullMaxMessages(r.cfg.MaxAckPending),
		jetstream.PullExpiry(r.cfg.PinnedTTL/2),
		jetstream.ConsumeErrHandler(func(cc jetstream.ConsumeContext, err error) { r.consumeErr(hctx, cc, endAcks, err) }))
	if err != nil {
		endAcks()
		return nil, nil, fmt.Errorf("effect: consume %s: %w", r.Consumer(), err)
	}
	return cc, endAcks, nil
}

// consumeErr is the consume error handler. An error the client stops
// consuming on is logged as a warning (keep makes the consumer again);
// a silent server (no heartbeats) has the runner ask whether the consumer
// is still there, and stop consuming a gone one, for keep to make again.
func (r *Runner) consumeErr(hctx context.Context, cc jetstream.ConsumeContext, endAcks context.CancelFunc, err error) {
	switch {
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrBadRequest):
		r.log.Warn("effect runner: the server ended the consumer's pulls; making it again", slog.String("consumer", r.Consumer()),
			slog.String("error", err.Error()))
	case errors.Is(err, jetstream.ErrNoHeartbeat):
		r.log.Debug("effect consume", slog.String("consumer", r.Consumer()), slog.String("error", err.Error()))
		go r.checkConsumer(hctx, cc, endAcks)
	default:
		r.log.Debug("effect consume", slog.String("consumer", r.Consumer()), slog.String("error", err.Error()))
	}
}

// keep consumes again, until Stop (hctx ends), each time the consume
// context cc ends without Stop: after RetryDelay, doubling up to
// keepDelayMax while making the consumer fails.
func (r *Runner) keep(hctx context.Context, cc jetstream.ConsumeContext, endAcks context.CancelFunc, kept chan struct{}) {
	defer close(kept)
	check := time.NewTicker(r.cfg.PinnedTTL)
	defer check.Stop()
	for {
		select {
		case <-hctx.Done():
			return
		case <-check.C:
			r.checkConsumer(hctx, cc, endAcks)
			continue
		case <-cc.Closed():
			endAcks()
		}
		delay := r.cfg.RetryDelay
		for {
			select {
			case <-hctx.Done():
				return
			case <-time.After(delay):
			}
			ctx, cancel := context.WithTimeout(hctx, r.cfg.AckWait)
			next, nextEndAcks, err := r.consume(ctx, hctx)
			cancel()
			if err == nil {
				r.mu.Lock()
				if hctx.Err() != nil {
					r.mu.Unlock()
					next.Stop()
					return
				}
				r.cc, cc, endAcks = next, next, nextEndAcks
				r.mu.Unlock()
				r.log.Info("effect runner consuming again", slog.String("consumer", r.Consumer()))
				break
			}
			r.log.Warn("effect runner: making the consumer again failed; retrying", slog.String("consumer", r.Consumer()),
				slog.String("error", err.Error()))
			delay = min(2*delay, keepDelayMax)
		}
	}
}

// checkConsumer asks the server whether the runner's consumer is still
// there and stops consuming cc when it is not, for keep to make it again.
// The client notices a deleted consumer only when the server tells a
// pull so or stops its heartbeats, and neither is certain (a pull that
// expires as the consumer goes is answered with a timeout, and the next
// pulls go to no one), so keep asks on a timer of its own: every
// PinnedTTL, one consumer info request.
func (r *Runner) checkConsumer(hctx context.Context, cc jetstream.ConsumeContext, endAcks context.CancelFunc) {
	ctx, cancel := context.WithTimeout(hctx, r.cfg.AckWait)
	defer cancel()
	if _, err := r.js.Consumer(ctx, wire.StreamLog, r.Consumer()); errors.Is(err, jetstream.ErrConsumerNotFound) {
		r.log.Warn("effect runner: the server no longer has the consumer; making it again", slog.String("consumer", r.Consumer()))
		endAcks()
		cc.Stop()
	}
}

// keepDelayMax bounds the wait between attempts to make the consumer
// again.
const keepDelayMax = 5 * time.Second

// Stop ends consuming and waits for a handler in progress, whose context
// it cancels. An effect whose handler did not return nil is not acked, so
// another runner (or this one, started again) calls it again.
func (r *Runner) Stop() {
	r.mu.Lock()
	cc, cancel, kept := r.cc, r.cancel, r.kept
	r.cc = nil
	r.mu.Unlock()
	if cc == nil {
		return
	}
	cancel()
	<-kept // keep makes no consumer after this
	r.mu.Lock()
	if r.cc != nil { // made by keep before it saw the cancel
		cc = r.cc
		r.cc = nil
	}
	r.mu.Unlock()
	cc.Stop()
	<-cc.Closed()
	r.handling.Lock()
	defer r.handling.Unlock()
}

// handle is one delivery: decode, filter by type, call the handler for
// each effect, then ack. The order is the at-least-once rule: an ack before
// the handler returned would lose the effect if the runner stopped in
// between. A log batch (several committed events in one message) is acked
// once every effect in it is done; when one fails, the message comes back,
// and the effects before it that this runner did already are not called
// again (another runner, or this one after a restart, calls them again:
// at least once).
func (r *Runner) handle(ctx, actx context.Context, m jetstream.Msg) {
	r.handling.Lock()
	defer r.handling.Unlock()
	copies, err := r.sub.DecodeLogCopies(m.Subject(), m.Headers(), m.Data())
	if err != nil {
		// The ledger writes every log copy through the same codec: this
		// is not an intent anyone committed, and retrying cannot fix it.
		r.log.Error("effect: log message is not a committed event; skipped", slog.String("subject", m.Subject()),
			slog.String("error", err.Error()))
		_ = m.Term()
		return
	}
	var delivery, seq uint64
	if md, err := m.Metadata(); err == nil {
		delivery, seq = md.NumDelivered, md.Sequence.Stream
	}
	var effects []Effect
	for i := range copies {
		if c := &copies[i]; slices.Contains(r.cfg.Types, c.Type) {
			effects = append(effects, Effect{ID: c.EventID, Task: c.Task, Partition: c.Partition, Version: c.Version,
				Type: c.Type, Payload: c.Payload, Fence: wire.Fence{Partition: c.Partition, Holder: c.Holder, Generation: c.Generation},
				Seq: c.Seq, CommittedAt: c.CommittedAt, Delivery: delivery})
		}
	}
	if len(effects) == 0 {
		// Not an effect: nothing to lose, so no round trip for the
		// server's confirmation (a lost ack only delivers it again).
		_ = m.Ack()
		return
	}
	done := r.partly.take(seq)
	for _, e := range effects {
		if done[e.ID] {
			continue
		}
		if err := r.call(ctx, m, e); err != nil {
			r.log.Warn("effect failed; will retry", slog.String("event_id", e.ID), slog.String("task", e.Task),
				slog.String("type", e.Type), slog.Uint64("delivery", e.Delivery), slog.String("error", err.Error()))
			if len(done) > 0 {
				r.partly.keep(seq, done)
			}
			_ = m.NakWithDelay(r.cfg.RetryDelay)
			return
		}
		if len(effects) > 1 {
			if done == nil {
				done = map[string]bool{}
			}
			done[e.ID] = true
		}
	}
	if hook := r.cfg.BeforeAck; hook != nil {
		for _, e := range effects {
			if err := hook(ctx, e); err != nil {
				// As a crash here would: no ack, no nak. The server
				// delivers the effects again after AckWait.
				r.log.Warn("effect not acked: before-ack hook", slog.String("event_id", e.ID), slog.String("error", err.Error()))
				return
			}
		}
	}
	r.ack(actx, m, effects[0].ID)
}

// partlyDone remembers, per log batch (by stream sequence), the effects
// this runner did in a delivery that failed later on, so the redelivery
// does not call them again. It is bounded: past partlyDoneMax batches it
// forgets one, whose effects are then called again (at least once).
type partlyDone map[uint64]map[string]bool

// partlyDoneMax bounds partlyDone.
const partlyDoneMax = 256

// take returns and forgets what was done of the batch at seq.
func (p *partlyDone) take(seq uint64) map[string]bool {
	done := (*p)[seq]
	delete(*p, seq)
	return done
}

// keep remembers what was done of the batch at seq.
func (p *partlyDone) keep(seq uint64, done map[string]bool) {
	if *p == nil {
		*p = partlyDone{}
	}
	for old := range *p {
		if len(*p) < partlyDoneMax {
			break
		}
		delete(*p, old)
	}
	(*p)[seq] = done
}

// call runs the handler, telling the server the effect is in progress every
// third of AckWait, so a slow handler is not delivered to another runner
// meanwhile.
func (r *Runner) call(ctx context.Context, m jetstream.Msg, e Effect) error {
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(r.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	if err := r.h(ctx, e); err != nil {
		return fmt.Errorf("effect: handler of %s (%s of %s): %w", e.ID, e.Type, e.Task, err)
	}
	return nil
}

// ack stores the runner's progress past m, waiting for the server's
// confirmation. A lost ack is harmless: the effect is delivered again, and
// its key makes the second call a repeat.
func (r *Runner) ack(ctx context.Context, m jetstream.Msg, id string) {
	actx, cancel := context.WithTimeout(ctx, r.cfg.AckWait)
	defer cancel()
	if err := m.DoubleAck(actx); err != nil && !errors.Is(err, context.Canceled) {
		r.log.Warn("effect ack not confirmed; it may run again", slog.String("event_id", id), slog.String("error", err.Error()))
	}
}
