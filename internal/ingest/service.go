// Package ingest is the ingest service: it takes generation-tagged events
// from LEDGER_IN, commits them with the fenced append, stores the committed
// copies in LEDGER_LOG and the rejected ones in LEDGER_DLQ, sends each
// holder its receipts, and only then acks. It also serves the lease micro
// service of docs/contract.md §1.
//
// Faults are never verdicts. The rules that make it so:
//
//   - A message in hand is kept alive. Every message this process was handed
//     gets a progress ack every AckWait/3 until it is acked or handed back;
//     a lane that stays full hands its new messages back at once. Only a
//     process that stops (killed, paused, cut off) lets its messages go to
//     another ingest, after AckWait.
//   - A gap verdict waits for the task's earlier messages. An event whose
//     version is ahead of its head is judged gap only after its gap window
//     (from its arrival in LEDGER_IN) and only if LEDGER_IN holds no earlier
//     message on its subject; an earlier one, if it is the missing version,
//     was published and acknowledged first and has no verdict yet.
//   - Failures of PostgreSQL or NATS are retried with backoff, the batch
//     kept in hand; they never produce a verdict.
//   - One event id has one final verdict: the fence makes a recorded
//     rejection final (pkg/fence), so a redelivered copy gets the same
//     verdict, or duplicate if it was committed.
//
// Hostile input is bounded: headers over wire.MaxHeaderBytes are invalid, a
// dead letter always fits LEDGER_DLQ, a version more than MaxAhead ahead is
// judged at once, and at most MaxWaitingPerPrincipal of a principal's events
// wait here, so no single message or principal can stop the service for
// anyone else.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// AckWaitDefault is the ingest consumer's ack wait: 10 s. A message in hand
// gets a progress ack every AckWait/3, so this is how long the messages of a
// crashed or paused ingest wait before another one takes them; it is well
// below the gap window, so their successors never wait out their window
// behind them (streams/README.md).
const AckWaitDefault = 10 * time.Second

// pullExpiry is how long one pull request of the ingest consumer lasts.
const pullExpiry = 5 * time.Second

// PublishTimeoutDefault bounds the wait for one copy's publish ack: 5 s.
const PublishTimeoutDefault = 5 * time.Second

// Service is one ingest process. Several may run on the same consumer.
type Service struct {
	cfg      Config
	nc       *nats.Conn
	js       jetstream.JetStream
	store    *fence.Store
	log      *slog.Logger
	subjects wire.Subjects
	metrics  *metrics

	lanes      []*lane
	held       *heldSet
	inStream   jetstream.Stream
	logStream  jetstream.Stream
	waiting    *waitingSet
	stopping   chan struct{} // closed when Stop begins
	stopOnce   sync.Once
	wg         sync.WaitGroup
	workCtx    context.Context
	cancelWork context.CancelFunc
	consume    jetstream.ConsumeContext
	letterMax  int // the largest dead letter the server and LEDGER_DLQ take
	svc        micro.Service
	copies     *copier
}

// Deps are what the service runs on.
type Deps struct {
	NC    *nats.Conn
	Store *fence.Store
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the service's metrics; nil records none.
	Registerer prometheus.Registerer
}

// New checks cfg and returns a service that is not yet started.
func New(cfg Config, d Deps) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if d.NC == nil || d.Store == nil {
		return nil, errors.New("ingest: a NATS connection and a fence store are required")
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	js, err := jetstream.New(d.NC)
	if err != nil {
		return nil, fmt.Errorf("ingest: jetstream: %w", err)
	}
	if d.Registerer != nil {
		watchAppends(d.Registerer, d.Store)
	}
	return &Service{cfg: cfg, nc: d.NC, js: js, store: d.Store, log: d.Logger,
		subjects: wire.Subjects{Prefix: cfg.Prefix}, metrics: newMetrics(d.Registerer),
		held: newHeldSet(), waiting: newWaitingSet(), stopping: make(chan struct{})}, nil
}

// Start applies the streams and the consumer, starts the lease service and
// begins consuming. It returns once all of that is running.
func (s *Service) Start(ctx context.Context) error {
	opts := streams.Options{Prefix: s.cfg.Prefix, Replicas: s.cfg.Replicas}
	if err := streams.Apply(ctx, s.js, opts); err != nil {
		return err
	}
	ccfg, err := streams.Consumer("ingest", opts)
	if err != nil {
		return err
	}
	ccfg.AckWait = s.cfg.AckWait
	cons, err := s.js.CreateOrUpdateConsumer(ctx, wire.StreamIn, ccfg)
	if err != nil {
		return fmt.Errorf("ingest: consumer: %w", err)
	}
	if s.inStream, err = s.js.Stream(ctx, wire.StreamIn); err != nil {
		return fmt.Errorf("ingest: stream %s: %w", wire.StreamIn, err)
	}
	if s.logStream, err = s.js.Stream(ctx, wire.StreamLog); err != nil {
		return fmt.Errorf("ingest: stream %s: %w", wire.StreamLog, err)
	}
	dlq, err := s.js.Stream(ctx, wire.StreamDLQ)
	if err != nil {
		return fmt.Errorf("ingest: stream %s: %w", wire.StreamDLQ, err)
	}
	s.letterMax = int(s.nc.MaxPayload())
	if limit := dlq.CachedInfo().Config.MaxMsgSize; limit > 0 {
		s.letterMax = min(s.letterMax, int(limit))
	}

	if s.copies, err = newCopier(s.nc); err != nil {
		return err
	}
	if h := s.cfg.hooks; h != nil {
		s.copies.drop = h.dropCopy
	}
	s.workCtx, s.cancelWork = context.WithCancel(context.WithoutCancel(ctx))
	view := startLeaseView(s.workCtx, s.js, opts, s.log)
	svc, err := startLeaseService(s.workCtx, s.nc, s.store, s.cfg, s.log, s.metrics, view)
	if err != nil {
		s.cancelWork()
		s.copies.close()
		return err
	}
	s.svc = svc
	// The endpoints are usable once the server has their subscriptions.
	if err := s.nc.FlushTimeout(10 * time.Second); err != nil {
		s.Stop()
		return fmt.Errorf("ingest: flush: %w", err)
	}

	s.lanes = make([]*lane, s.cfg.Lanes)
	for i := range s.lanes {
		s.lanes[i] = &lane{ch: make(chan *inbound, s.cfg.BatchSize), stored: map[string]int64{}}
		s.wg.Add(1)
		go s.runLane(s.lanes[i])
	}
	s.held.off = s.cfg.hooks != nil && s.cfg.hooks.noKeepAlive
	go s.held.keepAlive(s.cfg.AckWait/3, s.stopping)
	s.consume, err = cons.Consume(s.route,
		jetstream.PullMaxMessages(min(2*s.cfg.BatchSize*s.cfg.Lanes, 4000)),
		// A pull that expires every 5 s (heartbeats every 2.5 s) is found
		// dead within about 5 s when its consumer's leader moves; with the
		// default 30 s expiry the ingest stood still for up to 30 s after a
		// node was lost. Idle, it costs a pull request every 5 s.
		jetstream.PullExpiry(pullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			s.log.Warn("consume", slog.String("error", err.Error()))
		}))
	if err != nil {
		s.Stop()
		return fmt.Errorf("ingest: consume: %w", err)
	}
	s.log.Info("ingest started", slog.String("prefix", s.cfg.Prefix), slog.Int("lanes", s.cfg.Lanes),
		slog.Int("batch_size", s.cfg.BatchSize), slog.String("gap_window", s.cfg.GapWindow.String()))
	return nil
}

// route hands a message to the lane of its partition, so that one
// partition's events are appended in arrival order. From then on the
// message is held: it gets progress acks until it is acked or handed back.
//
// A lane that stays full (its database is away, say) would block this
// callback, and the messages JetStream has already sent behind it would sit
// in the client's buffer without progress acks until AckWait handed them to
// another ingest. So a route that waits AckWait/4 for room marks the lane
// stuck, and while it is stuck the lane's messages are handed back at once
// for another ingest (or this one, later) to take. Once Stop has begun,
// every message is handed back.
func (s *Service) route(m jetstream.Msg) {
	in := &inbound{msg: m, received: time.Now()}
	if meta, err := m.Metadata(); err == nil {
		in.sourceSeq, in.delivered, in.published = meta.Sequence.Stream, meta.NumDelivered, meta.Timestamp
	}
	s.waiting.back(in.sourceSeq)
	l := s.lanes[0]
	if _, p, _, err := s.subjects.ParseIn(m.Subject()); err == nil {
		l = s.lanes[p%len(s.lanes)]
	}
	select {
	case <-s.stopping:
		_ = m.Nak()
		return
	default:
	}
	s.held.add(in)
	select {
	case l.ch <- in:
		return
	default:
	}
	if h := s.cfg.hooks; h != nil && h.blockingRoute {
		select {
		case l.ch <- in:
		case <-s.stopping:
			s.held.release(in)
			_ = m.Nak()
		}
		return
	}
	if !l.stuck.Load() {
		t := time.NewTimer(s.cfg.AckWait / 4)
		defer t.Stop()
		select {
		case l.ch <- in:
			return
		case <-s.stopping:
			s.held.release(in)
			_ = m.Nak()
			return
		case <-t.C:
			l.stuck.Store(true)
			s.log.Warn("a lane stays full; handing its new messages back until it drains")
		}
	}
	s.held.release(in)
	_ = m.NakWithDelay(s.cfg.NotYetDelayMax)
}

// Stop stops fetching, finishes the batches in hand and stops the lease
// service. It returns within StopTimeout (plus the time a cancelled
// database call takes to return): what is not finished by then is handed
// back to JetStream for redelivery, at once. Stop is safe to call without
// Start and more than once.
func (s *Service) Stop() {
	first := false
	s.stopOnce.Do(func() { first = true })
	if !first {
		return
	}
	deadline := time.NewTimer(s.cfg.StopTimeout)
	defer deadline.Stop()
	close(s.stopping)
	if s.consume != nil {
		s.consume.Drain()
		select {
		case <-s.consume.Closed():
		case <-deadline.C:
			deadline.Reset(0)
		}
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-deadline.C:
		s.log.Warn("stop: batches still in hand after the stop timeout; handing them back",
			slog.String("stop_timeout", s.cfg.StopTimeout.String()))
		if s.cancelWork != nil {
			s.cancelWork()
		}
		<-done
	}
	// Whatever a lane did not take (it stopped first) goes back now.
	for _, in := range s.held.snapshot() {
		s.held.release(in)
		_ = in.msg.Nak()
	}
	if s.svc != nil {
		_ = s.svc.Stop()
	}
	if s.cancelWork != nil {
		s.cancelWork()
	}
	if s.copies != nil {
		s.copies.close()
	}
	s.log.Info("ingest stopped")
}

// CheckConsumer reports whether the ingest consumer exists and this process
// is consuming from it; it is a readiness check.
func (s *Service) CheckConsumer(ctx context.Context) error {
	if s.consume == nil {
		return errors.New("not consuming")
	}
	if _, err := s.js.Consumer(ctx, wire.StreamIn, "ingest"); err != nil {
		return fmt.Errorf("ingest consumer: %w", err)
	}
	return nil
}
