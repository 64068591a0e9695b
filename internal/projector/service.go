// Package projector is the projector service: it consumes the committed log
// (LEDGER_LOG), rebuilds each task's state with the ordering engine of
// pkg/projection, and keeps it in the KV bucket ledger_tasks. Versions it
// misses are read back from PostgreSQL; it never skips one.
//
// One goroutine owns the engine. Each turn takes a batch of log messages,
// offers them (loading a task's stored value from the bucket the first time
// it is seen), answers due re-fetches with one query, writes every changed
// state with compare-and-set on the key's revision, and only then settles
// the batch. So a crash loses nothing: an unacked message is redelivered,
// and an acked one is either applied in the bucket or, if it was waiting for
// an earlier version, recorded as the task's gap, which a restarted projector
// fills from PostgreSQL.
//
// A message is not acked when its effect could not be stored:
//
//   - If the task's stored value cannot be read, the message is nak'ed and
//     comes back later; the rest of the batch goes on.
//   - If the bucket refuses a task's state for lack of space, the task is
//     held: its state is written again later, with backoff, and the message
//     of its newest version stays unacked until then (an older one is
//     acked: the newest alone makes a restarted projector catch the task up).
//     Other tasks keep flowing.
//   - A transient failure (a timeout, the connection) is retried, and the
//     batch waits for it.
//
// A state whose data does not fit in a bucket value is stored without it
// (data null, data_too_large its size; CONTRACT §6). The engine keeps the
// true data; loading such a value folds the data again from PostgreSQL.
package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// Deps are what the projector runs on.
type Deps struct {
	NC   *nats.Conn
	Pool *pgxpool.Pool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil records none.
	Registerer prometheus.Registerer
}

// Service is one projector process.
type Service struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	pool    *pgxpool.Pool
	log     *slog.Logger
	metrics *metrics
	subj    wire.Subjects

	engine *projection.Engine
	kv     jetstream.KeyValue
	marks  jetstream.KeyValue // open-gap markers (bucket ledger_projector)
	// revs is the bucket revision of the value of each resident task, and
	// of each held one. A revision is dropped only with its task: a
	// compare-and-set on a forgotten one fails and costs a re-read.
	revs      map[string]uint64
	gaps      map[string]time.Time // open gaps, for the oldest-gap metric
	held      map[string]*heldTask // states the bucket refused for lack of space
	oversized map[string]bool      // tasks whose last value went without its data
	// valueLimit is the largest value the bucket takes: its max_value_size
	// and the connection's max payload, less room for the headers.
	valueLimit int

	in      chan jetstream.Msg
	consume jetstream.ConsumeContext
	stop    chan struct{}
	done    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	once    sync.Once
}

// heldTask is a task whose latest state the bucket refused.
type heldTask struct {
	st    projection.State
	next  time.Time     // when to write it again
	delay time.Duration // backoff, RetryMin doubling to RetryMax
	// keep is the newest version among the task's log messages: its message
	// stays unacked while the task is held.
	keep int64
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
	js, err := jetstream.New(d.NC, jetstream.WithPublishAsyncMaxPending(4*cfg.BatchSize),
		jetstream.WithPublishAsyncTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("projector: jetstream: %w", err)
	}
	return &Service{cfg: cfg, nc: d.NC, js: js, pool: d.Pool, log: d.Logger, metrics: newMetrics(d.Registerer),
		subj: wire.Subjects{Prefix: cfg.Prefix}, engine: engine, revs: map[string]uint64{}, gaps: map[string]time.Time{},
		held: map[string]*heldTask{}, oversized: map[string]bool{},
		in: make(chan jetstream.Msg, 2*cfg.BatchSize), stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start makes sure the streams and the bucket exist, binds the consumer of
// the partition set (creating it on first use) and starts projecting. It
// must not run concurrently with Stop, and a stopped Service does not start
// again.
func (s *Service) Start(ctx context.Context) error {
	select {
	case <-s.stop:
		return errors.New("projector: stopped")
	default:
	}
	if err := s.prepare(ctx); err != nil {
		return err
	}
	cons, err := s.consumer(ctx, jetstream.DeliverAllPolicy)
	if err != nil {
		return err
	}
	if err := s.resumeGaps(ctx); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.ctx = runCtx
	consume, err := cons.Consume(s.deliver,
		jetstream.PullMaxMessages(2*s.cfg.BatchSize),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			s.log.Warn("consume", slog.String("error", err.Error()))
		}))
	if err != nil {
		cancel()
		s.ctx = nil
		return fmt.Errorf("projector: consume: %w", err)
	}
	s.consume, s.cancel = consume, cancel
	go s.run()
	s.log.Info("projector started", slog.String("consumer", s.cfg.durable()), slog.Any("filters", s.cfg.filters()))
	return nil
}

// deliver hands a message to the run loop. Once stopping, the message is
// given back for redelivery rather than waited on forever: the loop that
// would take it may be gone.
func (s *Service) deliver(m jetstream.Msg) {
	select {
	case s.in <- m:
	case <-s.stop:
		_ = m.Nak()
	}
}

// giveBack naks the messages waiting in the channel, so that the next
// projector gets them at once rather than after the ack wait.
func (s *Service) giveBack() {
	for {
		select {
		case m := <-s.in:
			_ = m.Nak()
		default:
			return
		}
	}
}

func (s *Service) prepare(ctx context.Context) error {
	opts := streams.Options{Prefix: s.cfg.Prefix, Replicas: s.cfg.Replicas}
	if err := streams.Apply(ctx, s.js, opts); err != nil {
		return err
	}
	kv, cfg, err := s.applyBucket(ctx, wire.BucketTasks, s.cfg.TasksMaxBytes, opts)
	if err != nil {
		return err
	}
	marks, _, err := s.applyBucket(ctx, wire.BucketProjector, s.cfg.MarksMaxBytes, opts)
	if err != nil {
		return err
	}
	s.kv, s.marks = kv, marks
	s.valueLimit = valueLimit(cfg.MaxValueSize, s.nc.MaxPayload())
	return nil
}

// applyBucket creates or updates a bucket of streams/ with max_bytes set to
// maxBytes unless it is 0.
func (s *Service) applyBucket(ctx context.Context, name string, maxBytes int64, opts streams.Options) (jetstream.KeyValue, jetstream.KeyValueConfig, error) {
	cfg, err := streams.Bucket(name, opts)
	if err != nil {
		return nil, cfg, err
	}
	if maxBytes != 0 {
		cfg.MaxBytes = maxBytes
	}
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, cfg, fmt.Errorf("projector: apply bucket %s: %w", cfg.Bucket, err)
	}
	return kv, cfg, nil
}

// kvHeaderRoom is what a value leaves of the bucket's message size for the
// headers of its write (the expected revision).
const kvHeaderRoom = 256

// valueLimit is the largest value a write can carry.
func valueLimit(maxValueSize int32, maxPayload int64) int {
	limit := maxPayload
	if maxValueSize > 0 && (limit <= 0 || int64(maxValueSize) < limit) {
		limit = int64(maxValueSize)
	}
	if limit <= 0 {
		limit = 1 << 20 // the NATS default
	}
	return int(max(limit-kvHeaderRoom, 0))
}

// markKey is the open-gap marker of a task for this projector's consumer.
func (s *Service) markKey(task string) string { return s.cfg.durable() + "." + task }

// resumeGaps loads every task a previous run left waiting for a missing
// version, so that the engine re-fetches it even if no event of it arrives.
func (s *Service) resumeGaps(ctx context.Context) error {
	lister, err := s.marks.ListKeysFiltered(ctx, s.cfg.durable()+".>")
	if err != nil {
		return fmt.Errorf("projector: list open gaps: %w", err)
	}
	var tasks []string
	for key := range lister.Keys() {
		tasks = append(tasks, key[len(s.cfg.durable())+1:])
	}
	for _, task := range tasks {
		if _, loaded := s.engine.State(task); loaded {
			continue
		}
		if _, err := s.load(task); err != nil {
			return fmt.Errorf("projector: resume gap of %s: %w", task, err)
		}
		if st, _ := s.engine.State(task); st.Gap != nil {
			s.gaps[task] = st.Gap.Since
		} else {
			_ = s.marks.Delete(ctx, s.markKey(task))
		}
	}
	if len(tasks) > 0 {
		s.log.Info("resumed open gaps", slog.Int("tasks", len(tasks)))
	}
	return nil
}

// consumer binds the durable consumer of the partition set, creating it
// with the given deliver policy if it does not exist. An existing consumer
// keeps its position (a deliver policy cannot be changed).
func (s *Service) consumer(ctx context.Context, policy jetstream.DeliverPolicy) (jetstream.Consumer, error) {
	if c, err := s.js.Consumer(ctx, wire.StreamLog, s.cfg.durable()); err == nil {
		return c, nil
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("projector: consumer %s: %w", s.cfg.durable(), err)
	}
	cfg, err := streams.Consumer("projector", streams.Options{Prefix: s.cfg.Prefix})
	if err != nil {
		return nil, err
	}
	cfg.Durable, cfg.Name = s.cfg.durable(), s.cfg.durable()
	cfg.FilterSubjects, cfg.FilterSubject = s.cfg.filters(), ""
	cfg.DeliverPolicy = policy
	cfg.AckWait = s.cfg.AckWait
	c, err := s.js.CreateConsumer(ctx, wire.StreamLog, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return s.js.Consumer(ctx, wire.StreamLog, s.cfg.durable())
	}
	if err != nil {
		return nil, fmt.Errorf("projector: create consumer %s: %w", s.cfg.durable(), err)
	}
	return c, nil
}

// Stop stops fetching and lets the turn in hand finish, for at most
// Config.StopTimeout: then it cancels the turn's reads and writes and
// returns. Messages not acked by then are redelivered to the next projector.
// Stop may be called without Start, and more than once.
func (s *Service) Stop() {
	s.once.Do(func() {
		close(s.stop) // first: it releases a delivery blocked on a full channel
		if s.consume != nil {
			// Drain, not Stop: the messages pulled already go through
			// deliver, which gives them back at once, instead of being
			// dropped to wait out the ack wait.
			s.consume.Drain()
		}
		if s.cancel == nil {
			return // never started
		}
		// A context, not a timer: its Done stays closed for every wait below.
		deadline, cancel := context.WithTimeout(context.Background(), s.cfg.StopTimeout)
		defer cancel()
		select {
		case <-s.done:
		case <-deadline.Done():
			s.log.Warn("projector stop timed out; the turn in hand is abandoned and its messages are redelivered",
				slog.Duration("stop_timeout", s.cfg.StopTimeout))
		}
		s.cancel()
		select {
		case <-s.consume.Closed():
		case <-deadline.Done():
		}
		s.giveBack()
		s.log.Info("projector stopped")
	})
}

// CheckConsumer is a readiness check: the consumer exists and is bound.
func (s *Service) CheckConsumer(ctx context.Context) error {
	if s.consume == nil {
		return errors.New("not consuming")
	}
	_, err := s.js.Consumer(ctx, wire.StreamLog, s.cfg.durable())
	return err
}

func (s *Service) run() {
	defer close(s.done)
	defer s.giveBack()
	tick := time.NewTicker(s.cfg.RefetchEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case m := <-s.in:
			batch := []jetstream.Msg{m}
		fill:
			for len(batch) < s.cfg.BatchSize {
				select {
				case m := <-s.in:
					batch = append(batch, m)
				default:
					break fill
				}
			}
			s.turn(batch)
		case <-tick.C:
			s.turn(nil)
		}
	}
}

// turn handles one batch (possibly empty), the due re-fetches and the held
// tasks that are due.
func (s *Service) turn(batch []jetstream.Msg) {
	changed := map[string]projection.State{}
	offered := make([]projection.Event, len(batch)) // Task "" when the message is settled already
	var newest time.Time
	for i, m := range batch {
		ev, committedAt, err := s.decode(m)
		if err != nil {
			// Only the ingest may publish to the log; anything else there
			// is dropped from the consumer, loudly.
			s.log.Error("undecodable message on the committed log; terminated", slog.String("subject", m.Subject()),
				slog.String("error", err.Error()))
			_ = m.Term()
			continue
		}
		if err := s.offer(ev, changed); err != nil {
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
	s.refetch(changed)
	s.retryHeld(changed)
	if !s.writeAll(changed) {
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

// decode reads a LEDGER_LOG message (CONTRACT §4).
func (s *Service) decode(m jetstream.Msg) (projection.Event, time.Time, error) {
	h := m.Headers()
	p, task, err := s.subj.ParseLog(m.Subject())
	if err != nil {
		return projection.Event{}, time.Time{}, err
	}
	version, err1 := strconv.ParseInt(h.Get(wire.HeaderVersion), 10, 64)
	seq, err2 := strconv.ParseInt(h.Get(wire.HeaderSeq), 10, 64)
	if err := errors.Join(err1, err2); err != nil || version < 1 {
		return projection.Event{}, time.Time{}, fmt.Errorf("bad %s or %s header", wire.HeaderVersion, wire.HeaderSeq)
	}
	at, _ := time.Parse(time.RFC3339Nano, h.Get(wire.HeaderCommittedAt))
	return projection.Event{Task: task, Partition: p, Version: version, Seq: seq,
		Type: h.Get(wire.HeaderType), Payload: m.Data()}, at, nil
}

// offer gives one event to the engine, loading the task the first time, and
// records the task's new state if it changed. It fails only if the task
// could not be loaded: then the event was not offered at all.
func (s *Service) offer(ev projection.Event, changed map[string]projection.State) error {
	res, err := s.engine.Offer(ev)
	if errors.Is(err, projection.ErrNotLoaded) {
		rewrite, err := s.load(ev.Task)
		if err != nil {
			if s.metrics != nil {
				s.metrics.loadFailures.Inc()
			}
			return err
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

func (s *Service) ctxOrBackground() context.Context {
	if s.ctx != nil {
		return s.ctx
	}
	return context.Background()
}

// observe updates the gauges and lets the engine shed idle tasks.
func (s *Service) observe(newest time.Time) {
	s.trim()
	if s.metrics == nil {
		return
	}
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
