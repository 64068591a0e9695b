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

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/quota"
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
	starting func(ctx context.Context, what string, step func() error) error

	lanes      []*lane
	held       *heldSet
	claims     *claims
	witness    *witness
	memory     memory
	inboxes    inboxSet
	suspects   suspects
	logStream  jetstream.Stream
	parked     *parkedCount
	stopping   chan struct{} // closed when Stop begins
	stopOnce   sync.Once
	wg         sync.WaitGroup
	workCtx    context.Context
	cancelWork context.CancelFunc
	letterMax  int // the largest dead letter the server and LEDGER_DLQ take
	logMax     int // the largest log batch the server and LEDGER_LOG take
	letters    *quota.Shared
	svc        micro.Service
	copies     *copier
	// copyJS publishes the tail check's copies on the copier's connection.
	copyJS jetstream.JetStream
}

// Deps are what the service runs on.
type Deps struct {
	NC    *nats.Conn
	Store *fence.Store
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the service's metrics; nil records none.
	Registerer prometheus.Registerer
	// WhileStarting, if set, runs Start's first reads of the database
	// (which change nothing) and may run one again after a failure that
	// retrying may cure (connect.Service.WhileStarting).
	WhileStarting func(ctx context.Context, what string, step func() error) error
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
	if n := d.Store.Partitions(); n > MaxPartitions {
		return nil, fmt.Errorf("ingest: %d partitions; an ingest decides at most %d (one JetStream consumer each)", n, MaxPartitions)
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
		subjects: wire.Subjects{Prefix: cfg.Prefix}, metrics: newMetrics(d.Registerer), starting: d.WhileStarting,
		letters: quota.NewShared(d.Store.Pool(), quota.DeadLetters, cfg.DeadLetterQuota), held: newHeldSet(), parked: &parkedCount{by: map[string]int{}}, stopping: make(chan struct{})}, nil
}

// Start applies the streams, starts the lease service and takes this
// process's share of the partitions (claims.go). It returns once all of
// that is running.
func (s *Service) Start(ctx context.Context) error {
	durability := func() error { return s.checkDurability(ctx, true) }
	if err := s.whileStarting(ctx, "PostgreSQL (durability)", durability); err != nil {
		return err
	}
	opts := streams.Options{Prefix: s.cfg.Prefix, Replicas: s.cfg.Replicas, Partitions: s.store.Partitions()}
	apply := func() error {
		err := streams.Apply(ctx, s.js, opts)
		if err != nil && ctx.Err() == nil && natsAway(err) {
			// A server restarting as the ingest starts: wait for it, as
			// for the database.
			return fmt.Errorf("%w: %w", connect.ErrUnreachable, err)
		}
		return err
	}
	if err := s.whileStarting(ctx, "NATS (streams)", apply); err != nil {
		return err
	}
	var err error
	s.inboxes.byName = map[string]jetstream.Stream{}
	if added, _, err := s.listInboxes(ctx); err != nil && len(added) == 0 {
		return fmt.Errorf("ingest: inbox streams: %w", err)
	} else if err != nil {
		// The others are consumed; each beat tries the rest again.
		s.log.Warn("some inbox streams cannot be read; consuming the others", slog.String("error", err.Error()))
	}
	if s.logStream, err = s.js.Stream(ctx, wire.StreamLog); err != nil {
		return fmt.Errorf("ingest: stream %s: %w", wire.StreamLog, err)
	}
	s.logMax = s.maxMsgBytes(s.logStream)
	dlq, err := s.js.Stream(ctx, wire.StreamDLQ)
	if err != nil {
		return fmt.Errorf("ingest: stream %s: %w", wire.StreamDLQ, err)
	}
	s.letterMax = s.maxMsgBytes(dlq)

	cc, err := copiesConn(s.nc)
	if err != nil {
		return err
	}
	if s.copies, err = newCopier(cc, true); err != nil {
		return err
	}
	if s.copyJS, err = jetstream.New(cc); err != nil {
		s.copies.close()
		return err
	}
	if h := s.cfg.hooks; h != nil {
		s.copies.drop = h.dropCopy
	}
	s.workCtx, s.cancelWork = context.WithCancel(context.WithoutCancel(ctx))
	w, err := openWitness(ctx, s.js, opts)
	if err != nil {
		s.cancelWork()
		s.copies.close()
		return err
	}
	w.off = buildUnguarded || s.cfg.hooks != nil && s.cfg.hooks.noWitness
	s.witness = w
	if g := s.store.Primary(); g != nil && !w.off {
		if s.cfg.hooks == nil || !s.cfg.hooks.noTimelineWitness {
			g.SetWitness(w.recordTimeline)
		}
		if s.cfg.hooks == nil || !s.cfg.hooks.noTimelineFollow {
			// A running ingest still connected to an old primary stops
			// writing there within a moment of another's first write on
			// the new one, not at its next beat.
			open := func(context.Context) (jetstream.KeyValue, error) { return w.kv, nil }
			go streams.FollowTimeline(s.workCtx, open, g.Raise, nil)
		}
	}
	if err := w.syncPrimary(ctx, s.store); errors.Is(err, fence.ErrSupersededPrimary) {
		// Not fatal: appends refuse an old primary, and the beat tries again.
		s.log.Error("the database is not the newest primary the ledger wrote to; committing nothing on it", slog.String("error", err.Error()))
	}
	view := startLeaseView(s.workCtx, s.js, opts, s.log)
	svc, err := startLeaseService(s.workCtx, s.nc, s.store, s.cfg, s.log, s.metrics, w, view)
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
		s.lanes[i] = &lane{ch: make(chan *inbound, s.cfg.BatchSize), stored: map[string]storedCopy{}, parked: map[string][]*inbound{}}
		s.wg.Add(1)
		go s.runLane(s.lanes[i])
	}
	s.held.off = s.cfg.hooks != nil && s.cfg.hooks.noKeepAlive
	go s.held.keepAlive(s.cfg.AckWait/3, s.stopping)
	s.memory = memory{checked: -1, off: buildUnguarded || s.cfg.hooks != nil && s.cfg.hooks.noMemoryCheck}
	if err := s.verify(ctx, true); err != nil && !errors.Is(err, errForgotten) {
		s.log.Warn("cannot tell yet whether the database holds every acknowledged commit; appends wait until it can",
			slog.String("error", err.Error()))
	}
	s.claims = &claims{owner: s.cfg.owner(), runs: map[int]*partRun{}}
	s.beat()
	s.wg.Add(1)
	go s.runClaims()
	// After the claims exist: the tail check remakes their consumers.
	if s.cfg.LogTailWindow > 0 {
		s.wg.Add(1)
		go s.runLogTail()
	}
	s.log.Info("ingest started", slog.String("prefix", s.cfg.Prefix), slog.String("owner", s.claims.owner),
		slog.Int("lanes", s.cfg.Lanes), slog.Int("batch_size", s.cfg.BatchSize), slog.String("gap_window", s.cfg.GapWindow.String()),
		slog.Any("partitions", s.claims.owned()))
	return nil
}

// route hands a message of partition p to the lane of its partition, so
// that one partition's events are appended in stream order. From then on
// the message is held: it gets progress acks until it is acked or handed
// back. A full lane makes route wait: the partition's consumer then stops
// delivering, which is the backpressure, and nothing leaves its order.
// Once Stop has begun, every message is handed back.
func (s *Service) route(m jetstream.Msg, p int) {
	m = s.taken(m)
	if s.subjects.IsInBatch(m.Subject()) && (s.cfg.hooks == nil || !s.cfg.hooks.noBatchDecode) {
		s.routeBatch(m, p)
		return
	}
	in := &inbound{msg: m, received: time.Now(), part: p}
	if meta, err := m.Metadata(); err == nil {
		in.stream, in.sourceSeq, in.delivered, in.published = meta.Stream, meta.Sequence.Stream, meta.NumDelivered, meta.Timestamp
	}
	s.enqueue(in)
}

// enqueue holds in and hands it to its partition's lane; false, and in
// handed back, when the service is stopping.
func (s *Service) enqueue(in *inbound) bool {
	l := s.lanes[s.laneOf(in)]
	select {
	case <-s.stopping:
		_ = in.msg.Nak()
		return false
	default:
	}
	s.held.add(in)
	select {
	case l.ch <- in:
		return true
	case <-s.stopping:
		if s.held.release(in) {
			_ = in.msg.Nak()
		}
		return false
	}
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
	if s.claims != nil {
		// No beat starts or stops a partition from here on. Stop must not
		// hold beatMu while it waits for the goroutines below: a lane or
		// the claims loop blocked on it would never finish.
		s.claims.beatMu.Lock()
		s.claims.stopped = true
		s.claims.beatMu.Unlock()
		s.claims.mu.Lock()
		runs := make([]*partRun, 0, len(s.claims.runs))
		for _, r := range s.claims.runs {
			runs = append(runs, r)
		}
		s.claims.mu.Unlock()
		var ccs []jetstream.ConsumeContext
		s.claims.mu.Lock()
		for _, r := range runs {
			for _, cc := range r.consumers {
				ccs = append(ccs, cc)
			}
		}
		s.claims.mu.Unlock()
		for _, cc := range ccs {
			cc.Drain()
		}
		for _, cc := range ccs {
			select {
			case <-cc.Closed():
			case <-deadline.C:
				deadline.Reset(0)
			}
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
	if s.claims != nil {
		s.leave()
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

// CheckConsumer reports whether this process takes part in deciding the
// partitions: its heartbeat reached the database within the claim TTL. An
// ingest that holds no partition (more ingests than partitions) is ready
// too: it stands by. It is a readiness check.
func (s *Service) CheckConsumer(context.Context) error {
	if s.claims == nil {
		return errors.New("not started")
	}
	return s.claimsBeaten()
}

// whileStarting runs a start step through Deps.WhileStarting, if set.
func (s *Service) whileStarting(ctx context.Context, what string, step func() error) error {
	if s.starting == nil {
		return step()
	}
	return s.starting(ctx, what, step)
}

// maxMsgBytes is the largest message both the server and stream take.
func (s *Service) maxMsgBytes(stream jetstream.Stream) int {
	n := int(s.nc.MaxPayload())
	if limit := stream.CachedInfo().Config.MaxMsgSize; limit > 0 {
		n = min(n, int(limit))
	}
	return n
}

// natsAway reports whether err says that the NATS server did not answer
// (it is restarting, or JetStream is not up yet), not that it refused.
func natsAway(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}

// CheckDurability reports an error while the database offers less
// durability than Config.RequireDurability: a readiness check.
func (s *Service) CheckDurability(ctx context.Context) error { return s.checkDurability(ctx, false) }

// checkDurability reads what the database's commits survive; at start it
// says so in the log, loudly when a failover could lose acknowledged
// events.
func (s *Service) checkDurability(ctx context.Context, start bool) error {
	d, err := s.store.ReadDurability(ctx)
	if err != nil {
		return err
	}
	s.metrics.durability(d.Level)
	if start {
		level := slog.LevelInfo
		if !d.Level.Meets(fence.DurabilitySync) {
			level = slog.LevelWarn
		}
		s.log.Log(ctx, level, "database durability", slog.String("level", string(d.Level)),
			slog.String("fsync", d.Fsync), slog.String("synchronous_commit", d.SynchronousCommit),
			slog.String("synchronous_standby_names", d.SynchronousStandbyNames), slog.Int("sync_standbys", d.SyncStandbys),
			slog.String("meaning", d.Explain()))
	}
	if !d.Level.Meets(s.cfg.RequireDurability) {
		return fmt.Errorf("ingest: the database offers durability %q, below the required %q: %s", d.Level, s.cfg.RequireDurability, d.Explain())
	}
	return nil
}

// CheckPrimary reports an error while the database is a superseded
// primary (fence.ErrSupersededPrimary): a readiness check.
func (s *Service) CheckPrimary(ctx context.Context) error {
	if s.witness == nil {
		return errors.New("not started")
	}
	return s.witness.syncPrimary(ctx, s.store)
}

// Partitions lists the partitions this process decides now.
func (s *Service) Partitions() []int {
	if s.claims == nil {
		return nil
	}
	return s.claims.owned()
}
