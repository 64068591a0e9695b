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
	// handling is held while a delivery is handled (Consume calls one at
	// a time), so Stop can wait for the one in progress.
	handling sync.Mutex
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
func (r *Runner) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cc != nil {
		return ErrStarted
	}
	cons, err := r.js.CreateOrUpdateConsumer(ctx, wire.StreamLog, r.consumerConfig())
	if err != nil {
		return fmt.Errorf("effect: create consumer %s on %s: %w", r.Consumer(), wire.StreamLog, err)
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cc, err := cons.Consume(func(m jetstream.Msg) { r.handle(hctx, m) },
		jetstream.PullPriorityGroup(priorityGroup),
		jetstream.PullMaxMessages(r.cfg.MaxAckPending),
		jetstream.PullExpiry(r.cfg.PinnedTTL/2),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			r.log.Debug("effect consume", slog.String("consumer", r.Consumer()), slog.String("error", err.Error()))
		}))
	if err != nil {
		cancel()
		return fmt.Errorf("effect: consume %s: %w", r.Consumer(), err)
	}
	r.cc, r.cancel = cc, cancel
	return nil
}

// Stop ends consuming and waits for a handler in progress, whose context
// it cancels. An effect whose handler did not return nil is not acked, so
// another runner (or this one, started again) calls it again.
func (r *Runner) Stop() {
	r.mu.Lock()
	cc, cancel := r.cc, r.cancel
	r.cc = nil
	r.mu.Unlock()
	if cc == nil {
		return
	}
	cancel()
	cc.Stop()
	<-cc.Closed()
	r.handling.Lock()
	defer r.handling.Unlock()
}

// handle is one delivery: decode, filter by type, call the handler, then
// ack. The order is the at-least-once rule: an ack before the handler
// returned would lose the effect if the runner stopped in between.
func (r *Runner) handle(ctx context.Context, m jetstream.Msg) {
	r.handling.Lock()
	defer r.handling.Unlock()
	c, err := r.sub.DecodeLog(m.Subject(), m.Headers(), m.Data())
	if err != nil {
		// The ledger writes every log copy through the same codec: this
		// is not an intent anyone committed, and retrying cannot fix it.
		r.log.Error("effect: log message is not a committed event; skipped", slog.String("subject", m.Subject()),
			slog.String("error", err.Error()))
		_ = m.Term()
		return
	}
	if !slices.Contains(r.cfg.Types, c.Type) {
		// Not an effect: nothing to lose, so no round trip for the
		// server's confirmation (a lost ack only delivers it again).
		_ = m.Ack()
		return
	}
	e := Effect{ID: c.EventID, Task: c.Task, Partition: c.Partition, Version: c.Version, Type: c.Type,
		Payload: c.Payload, Fence: wire.Fence{Partition: c.Partition, Holder: c.Holder, Generation: c.Generation},
		Seq: c.Seq, CommittedAt: c.CommittedAt}
	if md, err := m.Metadata(); err == nil {
		e.Delivery = md.NumDelivered
	}
	if err := r.call(ctx, m, e); err != nil {
		r.log.Warn("effect failed; will retry", slog.String("event_id", e.ID), slog.String("task", e.Task),
			slog.String("type", e.Type), slog.Uint64("delivery", e.Delivery), slog.String("error", err.Error()))
		_ = m.NakWithDelay(r.cfg.RetryDelay)
		return
	}
	if hook := r.cfg.BeforeAck; hook != nil {
		if err := hook(ctx, e); err != nil {
			// As a crash here would: no ack, no nak. The server delivers
			// the effect again after AckWait.
			r.log.Warn("effect not acked: before-ack hook", slog.String("event_id", e.ID), slog.String("error", err.Error()))
			return
		}
	}
	r.ack(ctx, m, e.ID)
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
