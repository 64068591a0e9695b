package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowness/ledger/internal/quota"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// Deps are what the projector runs on.
type Deps struct {
	// NC is the NATS connection; required.
	NC *nats.Conn
	// Pool is the database the missing versions are read from; required.
	Pool *pgxpool.Pool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil exposes them nowhere.
	Registerer prometheus.Registerer
	// Primary, when set, is the superseded-primary guard of Pool
	// (fence.GuardPool): the projector raises it to the newest timeline
	// the ingests recorded, so that it reads no old primary that came
	// back writable after a failover.
	Primary *fence.PrimaryGuard
}

// Service is one projector process. Projectors on disjoint partition sets
// may run side by side.
type Service struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	pool    *pgxpool.Pool
	log     *slog.Logger
	metrics *metrics
	subj    wire.Subjects
	// primary is Deps.Primary; noTimelineFollow (a test seam) leaves it
	// to learn newer timelines from the pool's own connections only.
	primary          *fence.PrimaryGuard
	noTimelineFollow bool

	// What the run loop owns; Rebuild uses it before Start.
	engine *projection.Engine
	kv     jetstream.KeyValue
	// tasks is the name of kv's bucket: ledger_tasks, or the scratch
	// bucket a rebuild builds in before it swaps.
	tasks string
	marks jetstream.KeyValue // open-gap markers (bucket ledger_projector)
	// revs is the bucket revision of the value of each resident task, and
	// of each held one. A revision is dropped only with its task: a
	// compare-and-set on a forgotten one fails and costs a re-read.
	revs      map[string]uint64
	gaps      map[string]time.Time // open gaps, for the oldest-gap metric
	held      map[string]*heldTask // states the bucket refused for lack of space
	oversized map[string]bool      // tasks whose last value went without its data
	// writers is the principal of the last event that changed each task
	// this turn: whose share of the bucket its value is charged to.
	writers map[string]string
	quota   *quota.Shared
	// archivedWarned is the tasks whose missing version was found archived
	// and said so (rebuild.go), once each.
	archivedWarned map[string]bool
	// valueLimit is the largest value the bucket takes: its max_value_size
	// and the connection's max payload, less room for the headers.
	valueLimit int
	recon      reconciler

	in         chan inMsg
	queue      *inQueue // bounds in by events (inqueue.go)
	consume    jetstream.ConsumeContext
	stop       chan struct{}      // closed when Stop begins
	done       chan struct{}      // closed when the run loop has returned
	cancelWork context.CancelFunc // cancels the turns' I/O; nil until Start
	once       sync.Once
}

// New checks cfg and returns a projector that is not yet started.
func New(cfg Config, d Deps) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if d.NC == nil || d.Pool == nil {
		return nil, errors.New("projector: a NATS connection and a database pool are required")
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	engine, err := projection.New(cfg.Engine)
	if err != nil {
		return nil, fmt.Errorf("projector: %w", err)
	}
	// A turn publishes a value per task at most, all before it awaits the acks.
	js, err := jetstream.New(d.NC, jetstream.WithPublishAsyncMaxPending(max(4*cfg.BatchSize, cfg.CatchUpBatchSize)),
		jetstream.WithPublishAsyncTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("projector: jetstream: %w", err)
	}
	if d.Primary != nil {
		d.Primary.Track(d.Pool)
	}
	return &Service{cfg: cfg, nc: d.NC, js: js, pool: d.Pool, log: d.Logger, metrics: newMetrics(d.Registerer), primary: d.Primary,
		subj: wire.Subjects{Prefix: cfg.Prefix}, engine: engine, revs: map[string]uint64{}, gaps: map[string]time.Time{},
		held: map[string]*heldTask{}, oversized: map[string]bool{},
		writers: map[string]string{}, quota: quota.NewShared(d.Pool, quota.Projections, cfg.TasksQuota),
		in: make(chan inMsg, 2*cfg.BatchSize), queue: newInQueue(2 * cfg.BatchSize), stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start makes sure the streams and the buckets exist, binds the consumer of
// the partition set (creating it on first use), picks up the gaps a previous
// run left open and starts projecting. It must not run concurrently with
// Stop, and a stopped Service does not start again.
func (s *Service) Start(ctx context.Context) error {
	select {
	case <-s.stop:
		return errors.New("projector: stopped")
	default:
	}
	if err := s.prepare(ctx); err != nil {
		return err
	}
	cons, err := s.consumer(ctx, jetstream.DeliverAllPolicy, 0)
	if err != nil {
		return err
	}
	if err := s.resumeGaps(ctx); err != nil {
		return err
	}
	consume, err := cons.Consume(s.deliver,
		// Enough in flight for a catch-up turn not to wait on each pull,
		// bounded in bytes: a message count let a backlog of log batches
		// overflow the client's buffer (inqueue.go).
		jetstream.PullMaxBytes(PullMaxBytes),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			s.log.Warn("consume", slog.String("error", err.Error()))
		}))
	if err != nil {
		return fmt.Errorf("projector: consume %s: %w", s.cfg.durable(), err)
	}
	// The turns outlive Start's ctx; only Stop ends them.
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.consume, s.cancelWork = consume, cancel
	go s.run(work)
	if s.primary != nil && !s.noTimelineFollow {
		go s.followTimeline(work)
	}
	s.log.Info("projector started", slog.String("consumer", s.cfg.durable()), slog.Any("filters", s.cfg.filters()))
	return nil
}

// Stop stops fetching and lets the turn in hand finish. It returns within
// Config.StopTimeout (plus the time a cancelled call to NATS or PostgreSQL
// takes to return): what is not finished by then is handed back to
// JetStream for redelivery, at once. Stop is safe to call without Start and
// more than once.
func (s *Service) Stop() { s.once.Do(s.stopOnce) }

func (s *Service) stopOnce() {
	close(s.stop)
	s.queue.close() // releases a delivery waiting for room
	if s.consume == nil {
		return // never started
	}
	// Drain, not Stop: the messages pulled already go through deliver,
	// which gives them back at once, instead of being dropped to wait out
	// the ack wait.
	s.consume.Drain()
	// A context, not a timer: its Done stays closed for every wait below.
	deadline, cancel := context.WithTimeout(context.Background(), s.cfg.StopTimeout)
	defer cancel()
	select {
	case <-s.done:
	case <-deadline.Done():
		s.log.Warn("projector stop timed out; the turn in hand is cancelled and its messages handed back",
			slog.String("stop_timeout", s.cfg.StopTimeout.String()))
	}
	s.cancelWork()
	<-s.done // a cancelled turn naks what it holds before the loop returns
	select {
	case <-s.consume.Closed():
	case <-deadline.Done():
	}
	s.giveBack()
	s.log.Info("projector stopped")
}

// CheckConsumer is a readiness check: the consumer exists and this process
// consumes from it.
func (s *Service) CheckConsumer(ctx context.Context) error {
	if s.consume == nil {
		return errors.New("not consuming")
	}
	if _, err := s.js.Consumer(ctx, wire.StreamLog, s.cfg.durable()); err != nil {
		return fmt.Errorf("projector consumer %s: %w", s.cfg.durable(), err)
	}
	return nil
}

// deliver hands a message to the run loop. Once stopping, the message is
// given back for redelivery rather than waited on forever: the loop that
// would take it may be gone.
func (s *Service) deliver(m jetstream.Msg) {
	w := s.weight(m)
	if !s.queue.reserve(w) {
		_ = m.Nak()
		return
	}
	// The room reserved is room in the channel too: a message weighs one
	// event at least, and the channel holds as many messages as the queue
	// events, so this send never waits.
	s.in <- inMsg{m: m, events: w}
}

// giveBack naks the messages waiting in the channel, so that the next
// projector gets them at once rather than after the ack wait.
func (s *Service) giveBack() {
	for {
		select {
		case in := <-s.in:
			_ = s.take(in).Nak()
		default:
			return
		}
	}
}
