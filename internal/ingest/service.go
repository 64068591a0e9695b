// Package ingest is the ingest service: it takes generation-tagged events
// from LEDGER_IN, commits them with the fenced append, stores the committed
// copies in LEDGER_LOG and the rejected ones in LEDGER_DLQ, sends each
// holder its receipts, and only then acks. It also serves the lease micro
// service of CONTRACT §1.
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

// AckWaitDefault is the ingest consumer's ack wait: 30 s (streams/README.md).
const AckWaitDefault = 30 * time.Second

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

	lanes      []chan *inbound
	closeMu    sync.RWMutex
	closed     bool
	wg         sync.WaitGroup
	workCtx    context.Context
	cancelWork context.CancelFunc
	consume    jetstream.ConsumeContext
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
	if cfg.AckWait == 0 {
		cfg.AckWait = AckWaitDefault
	}
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
	return &Service{cfg: cfg, nc: d.NC, js: js, store: d.Store, log: d.Logger,
		subjects: wire.Subjects{Prefix: cfg.Prefix}, metrics: newMetrics(d.Registerer)}, nil
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

	if s.copies, err = newCopier(s.nc); err != nil {
		return err
	}
	s.workCtx, s.cancelWork = context.WithCancel(context.WithoutCancel(ctx))
	svc, err := startLeaseService(s.workCtx, s.nc, s.store, s.cfg, s.log, s.metrics)
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

	s.lanes = make([]chan *inbound, s.cfg.Lanes)
	for i := range s.lanes {
		s.lanes[i] = make(chan *inbound, s.cfg.BatchSize)
		s.wg.Add(1)
		go s.runLane(s.lanes[i])
	}
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
		slog.Int("batch_size", s.cfg.BatchSize), slog.Duration("gap_window", s.cfg.GapWindow))
	return nil
}

// route hands a message to its lane, or back to JetStream once stopping.
func (s *Service) route(m jetstream.Msg) {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		_ = m.Nak()
		return
	}
	s.handle(m)
}

// Stop stops fetching, finishes the batches in hand (for at most
// StopTimeout; what is left is handed back for redelivery) and stops the
// lease service.
func (s *Service) Stop() {
	if s.consume != nil {
		s.consume.Drain()
		select {
		case <-s.consume.Closed():
		case <-time.After(s.cfg.StopTimeout):
		}
	}
	s.closeMu.Lock()
	if !s.closed {
		s.closed = true
		for _, ch := range s.lanes {
			close(ch)
		}
	}
	s.closeMu.Unlock()

	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.StopTimeout):
		s.log.Warn("stop: batches still in hand after the stop timeout; handing them back")
		s.cancelWork()
		<-done
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
