// Package projector is the projector service: it consumes the committed log
// (LEDGER_LOG), rebuilds each task's state with the ordering engine of
// pkg/projection, and keeps it in the KV bucket ledger_tasks. Versions it
// misses are read back from PostgreSQL; it never skips one.
//
// One goroutine owns the engine. Each turn takes a batch of log messages,
// offers them (loading a task's stored value from the bucket the first time
// it is seen), answers due re-fetches with one query, writes every changed
// state with compare-and-set on the key's revision, and only then acks the
// batch. So a crash loses nothing: an unacked message is redelivered, and an
// acked one is either applied in the bucket or, if it was waiting for an
// earlier version, recorded as the task's gap, which a restarted projector
// fills from PostgreSQL.
package projector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
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
	marks  jetstream.KeyValue   // open-gap markers (bucket ledger_projector)
	revs   map[string]uint64    // bucket revision of each task's value
	gaps   map[string]time.Time // open gaps, for the oldest-gap metric

	in      chan jetstream.Msg
	consume jetstream.ConsumeContext
	stop    chan struct{}
	done    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	once    sync.Once
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
		in: make(chan jetstream.Msg, 2*cfg.BatchSize), stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start makes sure the streams and the bucket exist, binds the consumer of
// the partition set (creating it on first use) and starts projecting.
func (s *Service) Start(ctx context.Context) error {
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
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s.consume, err = cons.Consume(func(m jetstream.Msg) { s.in <- m },
		jetstream.PullMaxMessages(2*s.cfg.BatchSize),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			s.log.Warn("consume", slog.String("error", err.Error()))
		}))
	if err != nil {
		return fmt.Errorf("projector: consume: %w", err)
	}
	go s.run()
	s.log.Info("projector started", slog.String("consumer", s.cfg.durable()), slog.Any("filters", s.cfg.filters()))
	return nil
}

func (s *Service) prepare(ctx context.Context) error {
	opts := streams.Options{Prefix: s.cfg.Prefix, Replicas: s.cfg.Replicas}
	if err := streams.Apply(ctx, s.js, opts); err != nil {
		return err
	}
	kv, err := streams.ApplyBucket(ctx, s.js, streams.BucketTasks, opts)
	if err != nil {
		return err
	}
	marks, err := streams.ApplyBucket(ctx, s.js, streams.BucketProjector, opts)
	if err != nil {
		return err
	}
	s.kv, s.marks = kv, marks
	return nil
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
		if err := s.load(task); err != nil {
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

// Stop stops fetching, finishes the batch in hand and returns. Unacked
// messages are redelivered to the next projector.
func (s *Service) Stop() {
	s.once.Do(func() {
		if s.consume != nil {
			s.consume.Stop()
		}
		close(s.stop)
		if s.cancel != nil {
			<-s.done
			s.cancel()
		}
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

// turn handles one batch (possibly empty) and the due re-fetches.
func (s *Service) turn(batch []jetstream.Msg) {
	changed := map[string]projection.State{}
	var newest time.Time
	for _, m := range batch {
		ev, committedAt, err := s.decode(m)
		if err != nil {
			// Only the ingest may publish to the log; anything else there
			// is dropped from the consumer, loudly.
			s.log.Error("undecodable message on the committed log; terminated", slog.String("subject", m.Subject()),
				slog.String("error", err.Error()))
			_ = m.Term()
			continue
		}
		s.offer(ev, changed)
		if committedAt.After(newest) {
			newest = committedAt
		}
	}
	s.refetch(changed)
	if !s.writeAll(changed) {
		return // stopping: the batch is redelivered
	}
	for _, m := range batch {
		_ = m.Ack()
	}
	s.observe(newest)
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

// offer gives one event to the engine, loading the task's stored value the
// first time, and records the task's new state if it changed.
func (s *Service) offer(ev projection.Event, changed map[string]projection.State) {
	res, err := s.engine.Offer(ev)
	if errors.Is(err, projection.ErrNotLoaded) {
		if err := s.load(ev.Task); err != nil {
			s.log.Warn("loading a projection failed; the event waits for redelivery", slog.String("task", ev.Task),
				slog.String("error", err.Error()))
			return
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
}

// load seeds the engine with a task's stored value (or an empty state).
func (s *Service) load(task string) error {
	ctx, cancel := context.WithTimeout(s.ctxOrBackground(), 5*time.Second)
	defer cancel()
	st := projection.State{Task: task}
	entry, err := s.kv.Get(ctx, task)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		s.revs[task] = 0
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(entry.Value(), &st); err != nil {
			return fmt.Errorf("stored value of %s is not a projection: %w", task, err)
		}
		s.revs[task] = entry.Revision()
	}
	return s.engine.Load(st)
}

func (s *Service) ctxOrBackground() context.Context {
	if s.ctx != nil {
		return s.ctx
	}
	return context.Background()
}

// refetch answers the engine's due re-fetches with one query.
func (s *Service) refetch(changed map[string]projection.State) {
	due := s.engine.DueRefetches()
	if len(due) == 0 {
		return
	}
	tasks, from, to := make([]string, len(due)), make([]int64, len(due)), make([]int64, len(due))
	for i, r := range due {
		tasks[i], from[i], to[i] = r.Task, r.FromVersion, r.ToVersion
	}
	ctx, cancel := context.WithTimeout(s.ctxOrBackground(), 30*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, sqlRefetch, tasks, from, to, s.cfg.RefetchLimit)
	if err != nil {
		s.log.Warn("re-fetch failed; the engine asks again", slog.Int("tasks", len(due)), slog.String("error", err.Error()))
		return
	}
	events, err := scanEvents(rows)
	if err != nil {
		s.log.Warn("re-fetch failed; the engine asks again", slog.Int("tasks", len(due)), slog.String("error", err.Error()))
		return
	}
	for _, ev := range events {
		s.offer(ev, changed)
	}
	if s.metrics != nil {
		s.metrics.refetches.Add(float64(len(due)))
		s.metrics.refetched.Add(float64(len(events)))
	}
	s.log.Debug("re-fetched", slog.Int("tasks", len(due)), slog.Int("events", len(events)))
}

func scanEvents(rows pgx.Rows) ([]projection.Event, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (projection.Event, error) {
		var ev projection.Event
		var payload string
		err := r.Scan(&ev.Task, &ev.Partition, &ev.Version, &ev.Seq, &ev.Type, &payload)
		ev.Payload = json.RawMessage(payload)
		return ev, err
	})
}

// writeAll stores every changed state, retrying until all are stored or the
// service stops.
func (s *Service) writeAll(changed map[string]projection.State) bool {
	delay := s.cfg.RetryMin
	for len(changed) > 0 {
		changed = s.write(changed)
		if len(changed) == 0 {
			return true
		}
		if s.metrics != nil {
			s.metrics.kvRetries.Add(float64(len(changed)))
		}
		select {
		case <-s.stop:
			return false
		case <-time.After(delay):
		}
		delay = min(2*delay, s.cfg.RetryMax)
	}
	return true
}

// write publishes the states with compare-and-set on each key's revision and
// returns the ones to try again.
func (s *Service) write(changed map[string]projection.State) map[string]projection.State {
	type pending struct {
		st projection.State
		f  jetstream.PubAckFuture
	}
	var ps []pending
	retry := map[string]projection.State{}
	for task, st := range changed {
		b, err := json.Marshal(st)
		if err != nil {
			s.log.Error("projection does not encode", slog.String("task", task), slog.String("error", err.Error()))
			continue
		}
		m := nats.NewMsg("$KV." + wire.BucketTasks + "." + task)
		m.Data = b
		f, err := s.js.PublishMsgAsync(m, jetstream.WithExpectLastSequencePerSubject(s.revs[task]))
		if err != nil {
			retry[task] = st
			continue
		}
		ps = append(ps, pending{st, f})
	}
	for _, p := range ps {
		task := p.st.Task
		select {
		case ack := <-p.f.Ok():
			s.revs[task] = ack.Sequence
			if !s.trackGap(p.st) {
				retry[task] = p.st // the marker did not stick: write both again
				continue
			}
			if s.metrics != nil {
				s.metrics.kvWrites.Inc()
			}
		case err := <-p.f.Err():
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
				apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
				if s.resolveConflict(p.st) {
					retry[task] = p.st
				}
				continue
			}
			s.log.Warn("writing a projection failed; retrying", slog.String("task", task), slog.String("error", err.Error()))
			retry[task] = p.st
		}
	}
	return retry
}

// resolveConflict handles a lost compare-and-set: someone else wrote the
// key. If the stored value is as new as ours or newer, ours is dropped and
// the task is reloaded from the bucket the next time it is seen; otherwise
// we write again on top of the stored revision. A stale value never
// overwrites a newer one.
func (s *Service) resolveConflict(ours projection.State) (again bool) {
	ctx, cancel := context.WithTimeout(s.ctxOrBackground(), 5*time.Second)
	defer cancel()
	entry, err := s.kv.Get(ctx, ours.Task)
	if err != nil {
		return true
	}
	var stored projection.State
	if json.Unmarshal(entry.Value(), &stored) != nil {
		s.revs[ours.Task] = entry.Revision()
		return true
	}
	s.revs[ours.Task] = entry.Revision()
	if stored.Version > ours.Version || (stored.Version == ours.Version && stored.Seq >= ours.Seq) {
		s.engine.Evict(ours.Task)
		delete(s.revs, ours.Task)
		return false
	}
	return true
}

// trackGap keeps the open-gap marker in step with a stored state: written
// when a gap opens (before the batch that opened it is acked), deleted when
// it closes. It reports false if the marker could not be written.
func (s *Service) trackGap(st projection.State) bool {
	ctx, cancel := context.WithTimeout(s.ctxOrBackground(), 5*time.Second)
	defer cancel()
	_, open := s.gaps[st.Task]
	switch {
	case st.Gap != nil && !open:
		if _, err := s.marks.Put(ctx, s.markKey(st.Task), []byte(wire.FormatTime(st.Gap.Since))); err != nil {
			s.log.Warn("open-gap marker not written", slog.String("task", st.Task), slog.String("error", err.Error()))
			return false
		}
		s.gaps[st.Task] = st.Gap.Since
	case st.Gap == nil && open:
		// A marker left behind only costs the next start a look at the task.
		_ = s.marks.Delete(ctx, s.markKey(st.Task))
		delete(s.gaps, st.Task)
	}
	return true
}

// observe updates the gauges and lets the engine shed idle tasks.
func (s *Service) observe(newest time.Time) {
	if n := s.engine.Trim(); n > 0 && len(s.revs) > 4*s.cfg.Engine.MaxTasks {
		s.revs = map[string]uint64{}
	}
	if s.metrics == nil {
		return
	}
	st := s.engine.Stats()
	s.metrics.openGaps.Set(float64(st.Waiting))
	s.metrics.buffered.Set(float64(st.Buffered))
	s.metrics.tasksInMem.Set(float64(st.Tasks))
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
