package benchreport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/flowness/ledger/internal/localstack"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// The bare pipeline's own stream, beside LEDGER_IN on the same server.
const (
	barePrefix   = "benchbare"
	bareStream   = "BENCH_BARE_IN"
	bareDurable  = "bare"
	drainPollGap = time.Millisecond
)

// rawBench publishes raw JetStream messages, with no SDK, into two
// pipelines on the same NATS server and database:
//
//   - full: LEDGER_IN → the ingest (fence.Append with every check, the
//     LEDGER_LOG copy, the receipt) → ack;
//   - bare: BENCH_BARE_IN → BareConsumers goroutines that fetch, run one
//     set-based fenced insert into ledger_bench, and ack; nothing else.
//
// Run keeps the projector stopped meanwhile, so the full pipeline is the
// ingest alone, as the bare one is its yardstick.
type rawBench struct {
	o      Options
	prog   *progress
	pool   *pgxpool.Pool
	store  *fence.Store
	holder string
	// leases are the full pipeline's, between hold and letGo: the SDK
	// workers need the partitions in between.
	leases *leaseSet

	nc         *nats.Conn
	js         jetstream.JetStream
	in         jetstream.Stream
	bareCons   jetstream.Consumer
	full, bare *rawSource
	// hot is the full pipeline's load on one task per partition.
	hot *rawSource
}

// startRaw connects the publisher and creates the bare pipeline's stream
// and consumer; hold takes the full pipeline's leases.
func startRaw(ctx context.Context, s *localstack.Stack, o Options, id string, prog *progress) (_ *rawBench, err error) {
	r := &rawBench{o: o, prog: prog, pool: s.Pool, store: s.Store, holder: wire.Holder("bench-"+id, "raw")}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.nc, err = nats.Connect(s.NATS.ClientURL(), nats.Name("bench-raw")); err != nil {
		return nil, fmt.Errorf("benchreport: connect the raw publisher: %w", err)
	}
	if r.js, err = jetstream.New(r.nc, jetstream.WithPublishAsyncMaxPending(RawInFlight)); err != nil {
		return nil, err
	}
	if r.in, err = r.js.Stream(ctx, wire.StreamIn); err != nil {
		return nil, fmt.Errorf("benchreport: stream %s: %w", wire.StreamIn, err)
	}
	if r.bareCons, err = createBareStream(ctx, r.js); err != nil {
		return nil, err
	}
	tasks := taskCount(o.Events)
	r.full = newRawSource(wire.Subjects{}, newLoad("bench-"+id+"-in-", tasks), r.holder, [partitions]int64{})
	r.hot = newRawSource(wire.Subjects{}, hotLoad("bench-"+id+"-hot-"), r.holder, [partitions]int64{})
	var one [partitions]int64
	for p := range one {
		one[p] = 1
	}
	r.bare = newRawSource(wire.Subjects{Prefix: barePrefix}, newLoad("bench-"+id+"-bare-", tasks), baselineHolder, one)
	return r, nil
}

// createBareStream creates the bare pipeline's stream and its consumer.
// The stream is a work queue like LEDGER_IN, otherwise with JetStream's
// defaults (file storage, a 2-minute duplicate window).
func createBareStream(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: bareStream,
		Subjects: []string{barePrefix + ".in.>"}, Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		return nil, fmt.Errorf("benchreport: create stream %s: %w", bareStream, err)
	}
	c, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: bareDurable,
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 20_000})
	if err != nil {
		return nil, fmt.Errorf("benchreport: create consumer %s: %w", bareDurable, err)
	}
	return c, nil
}

// hold takes every partition's lease for the full pipeline's events.
func (r *rawBench) hold(ctx context.Context) error {
	if r.leases != nil {
		return nil
	}
	l, err := acquireAll(ctx, r.store, r.holder)
	if err != nil {
		return fmt.Errorf("benchreport: raw publishers: %w", err)
	}
	r.leases, r.full.gens, r.hot.gens = l, l.gens, l.gens
	return nil
}

// letGo releases the leases hold took.
func (r *rawBench) letGo() {
	if r.leases != nil {
		r.leases.release()
		r.leases = nil
	}
}

func (r *rawBench) close() {
	r.letGo()
	if r.js != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = r.js.DeleteStream(ctx, bareStream)
	}
	if r.nc != nil {
		r.nc.Close()
	}
}

// rawSource makes the messages of one pipeline: tasks round robin, each
// task's versions counting on from one phase to the next.
type rawSource struct {
	subj     wire.Subjects
	load     *load
	holder   string
	gens     [partitions]int64
	versions []int64
	made     int
}

func newRawSource(subj wire.Subjects, l *load, holder string, gens [partitions]int64) *rawSource {
	return &rawSource{subj: subj, load: l, holder: holder, gens: gens, versions: make([]int64, len(l.tasks))}
}

// next returns the next n messages.
func (s *rawSource) next(n int) []*nats.Msg {
	out := make([]*nats.Msg, n)
	for i := range out {
		t := s.made % len(s.load.tasks)
		s.made++
		s.versions[t]++
		v, p := s.versions[t], s.load.parts[t]
		out[i] = s.subj.InboundMsg(wire.Inbound{ID: ulid.Make().String(), Partition: p, Task: s.load.tasks[t],
			Holder: s.holder, Generation: s.gens[p], Version: v, Type: eventType, Payload: payload(v)})
	}
	return out
}

// publish publishes m without waiting for its ack; the publisher waits
// while RawInFlight publishes are unacknowledged.
func (r *rawBench) publish(m *nats.Msg) error {
	_, err := r.js.PublishMsgAsync(m, jetstream.WithStallWait(ReceiptTimeout))
	return err
}

// publishAll publishes msgs and waits for every JetStream ack.
func (r *rawBench) publishAll(ctx context.Context, msgs []*nats.Msg, sent *atomic.Int64) error {
	for _, m := range msgs {
		if err := r.publish(m); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		sent.Add(1)
	}
	return awaitAcks(ctx, r.js)
}

// awaitAcks waits until JetStream acked every asynchronous publish of js,
// for at most ReceiptTimeout.
func awaitAcks(ctx context.Context, js jetstream.JetStream) error {
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(ReceiptTimeout):
		return errors.New("publishes not acknowledged")
	}
}

// fullRound publishes n events into LEDGER_IN and returns the rate at
// which they were stored, committed, copied to LEDGER_LOG, answered with
// a receipt and acked, and the machine's CPU time per event meanwhile.
// Nobody subscribes to the receipts: in a deployment the workers read them
// on their own machines.
func (r *rawBench) fullRound(ctx context.Context, title string, n int) (float64, time.Duration, error) {
	return r.fullRoundOf(ctx, r.full, title, n)
}

// fullRoundOf is fullRound with the events of src.
func (r *rawBench) fullRoundOf(ctx context.Context, src *rawSource, title string, n int) (float64, time.Duration, error) {
	msgs := src.next(n)
	var sent, left atomic.Int64
	left.Store(-1)
	r.prog.begin(title, n, func() int64 {
		if l := left.Load(); l >= 0 {
			return int64(n) - l
		}
		return sent.Load() // still publishing: an estimate
	})
	defer r.prog.end()

	cpu := startCPU()
	start := time.Now()
	if err := r.publishAll(ctx, msgs, &sent); err != nil {
		return 0, 0, err
	}
	// LEDGER_IN is a work queue and every publish is acked: an empty
	// stream means the ingest acked every event, after its outcome was
	// durable. Polled only now, so that the API requests do not weigh on
	// the publishing.
	last, since := int64(-1), time.Now()
	for {
		info, err := r.in.Info(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("read %s: %w", wire.StreamIn, err)
		}
		msgs := int64(info.State.Msgs)
		left.Store(msgs)
		if msgs == 0 {
			break
		}
		if msgs != last {
			last, since = msgs, time.Now()
		} else if time.Since(since) > ReceiptTimeout {
			return 0, 0, fmt.Errorf("%d events still in %s after %v without progress", msgs, wire.StreamIn, ReceiptTimeout)
		}
		time.Sleep(drainPollGap)
	}
	elapsed := time.Since(start)
	return float64(n) / elapsed.Seconds(), cpu.perEvent(n), nil
}

// bareRound publishes n events into the bare pipeline while it consumes
// them, and returns the rate from the first publish to the last ack and the
// machine's CPU time per event meanwhile.
func (r *rawBench) bareRound(ctx context.Context, title string, n int) (float64, time.Duration, error) {
	msgs := r.bare.next(n)
	var done atomic.Int64
	r.prog.begin(title, n, done.Load)
	defer r.prog.end()
	cpu := startCPU()
	start := time.Now()
	var sent atomic.Int64
	err := r.runBare(ctx, n, &done, nil, func(ctx context.Context) error { return r.publishAll(ctx, msgs, &sent) })
	if err != nil {
		return 0, 0, err
	}
	elapsed := time.Since(start)
	return float64(n) / elapsed.Seconds(), cpu.perEvent(n), nil
}

// runBare runs the bare pipeline's consumers until n events are committed
// and acked, while publish publishes them. committed, when not nil, hears
// each batch's event ids once its insert is committed.
func (r *rawBench) runBare(ctx context.Context, n int, done *atomic.Int64, committed func([]string),
	publish func(context.Context) error) error {
	return bareSink{cons: r.bareCons, subj: r.bare.subj, pool: r.pool}.run(ctx, n, done, committed, publish)
}

// bareSink is the consuming end of the bare pipeline: BareConsumers
// goroutines that fetch from the bare stream, insert with the set-based
// fenced insert into ledger_bench and ack.
type bareSink struct {
	cons jetstream.Consumer
	subj wire.Subjects
	pool *pgxpool.Pool
}

// run consumes until n events are committed (counted in done, each batch's
// ids passed to committed) while publish runs.
func (b bareSink) run(ctx context.Context, n int, done *atomic.Int64, committed func([]string),
	publish func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, BareConsumers+1)
	var wg sync.WaitGroup
	lastProgress := atomic.Int64{}
	lastProgress.Store(time.Now().UnixNano())
	for range BareConsumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.consume(ctx, n, done, committed, &lastProgress); err != nil {
				errs <- err
				cancel()
			}
		}()
	}
	if err := publish(ctx); err != nil {
		errs <- err
		cancel()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("bare pipeline: %w", err)
	}
	return ctx.Err()
}

// consume is one consumer of the bare pipeline.
func (b bareSink) consume(ctx context.Context, n int, done *atomic.Int64, committed func([]string),
	lastProgress *atomic.Int64) error {
	var batch setBatch
	ids := make([]string, 0, BareFetch)
	for done.Load() < int64(n) {
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(time.Unix(0, lastProgress.Load())) > ReceiptTimeout {
			return fmt.Errorf("%d of %d events committed, none for %v", done.Load(), n, ReceiptTimeout)
		}
		fetched, err := b.cons.Fetch(BareFetch, jetstream.FetchMaxWait(5*time.Millisecond))
		if err != nil {
			continue
		}
		var got []jetstream.Msg
		for m := range fetched.Messages() {
			got = append(got, m)
		}
		if len(got) == 0 {
			continue
		}
		batch, ids = setBatch{}, ids[:0]
		for _, m := range got {
			d, bad := b.subj.DecodeInbound(m.Subject(), m.Headers(), m.Data())
			if bad != nil {
				return fmt.Errorf("decode %s: %w", m.Subject(), bad)
			}
			batch.add(fence.Event{ID: d.ID, Partition: d.Partition, Task: d.Task, Version: d.Version, Type: d.Type,
				Payload: d.Payload, Holder: d.Holder, Generation: d.Generation})
			ids = append(ids, d.ID)
		}
		inserted, err := batch.insert(ctx, b.pool)
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if inserted != len(got) {
			return fmt.Errorf("the fence let in %d of %d events", inserted, len(got))
		}
		if committed != nil {
			committed(ids)
		}
		for _, m := range got {
			_ = m.Ack()
		}
		done.Add(int64(len(got)))
		lastProgress.Store(time.Now().UnixNano())
	}
	return nil
}

// checkCommitted fails unless ledger.events holds every event the full
// pipeline was given: an event the fence refused is acked too, after its
// dead letter, so an empty LEDGER_IN alone does not say so.
func (r *rawBench) checkCommitted(ctx context.Context) error {
	var n int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM ledger.events WHERE holder = $1`, r.full.holder).Scan(&n); err != nil {
		return fmt.Errorf("count the committed events: %w", err)
	}
	if n != r.full.made+r.hot.made {
		return fmt.Errorf("%d of %d events committed; see LEDGER_DLQ for the others", n, r.full.made+r.hot.made)
	}
	return nil
}

// rawLatency times events from their publish into LEDGER_IN to their
// receipt, on the publisher's connection, as a worker would read them.
func (r *rawBench) rawLatency(ctx context.Context, title string, n, rate int) (*latencyTimer, time.Duration, error) {
	t := newLatencyTimer(n)
	r.prog.begin(title, n, t.count)
	defer r.prog.end()
	sub, err := r.nc.Subscribe(wire.Subjects{}.Receipt(r.full.holder), func(m *nats.Msg) {
		at := time.Now().UnixNano()
		rc, err := wire.DecodeReceipt(m.Data)
		if err != nil {
			t.refuse(fmt.Sprintf("a receipt that does not decode: %v", err))
			return
		}
		if rc.Verdict != wire.VerdictCommitted {
			t.refuse(fmt.Sprintf("%s version %d: %s/%s", rc.Task, rc.Version, rc.Verdict, rc.Reason))
		}
		t.arrived(at, rc.EventID)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("subscribe to receipts: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1) // a burst of receipts must never be dropped
	if err := r.nc.Flush(); err != nil {
		return nil, 0, err
	}
	elapsed, err := pace(ctx, float64(rate), n, func(int) error {
		m := r.full.next(1)[0]
		t.sent(wire.EventIDOf(m.Header.Get(wire.HeaderMsgID)))
		return r.publish(m)
	})
	if err != nil {
		return nil, 0, err
	}
	return t, elapsed, t.wait(ctx, time.Now().Add(ReceiptTimeout))
}

// bareLatency times events from their publish into the bare pipeline to
// the commit of their insert.
func (r *rawBench) bareLatency(ctx context.Context, title string, n, rate int) (*latencyTimer, time.Duration, error) {
	t := newLatencyTimer(n)
	r.prog.begin(title, n, t.count)
	defer r.prog.end()
	var done atomic.Int64
	var elapsed time.Duration
	committed := func(ids []string) { t.arrived(time.Now().UnixNano(), ids...) }
	err := r.runBare(ctx, n, &done, committed, func(ctx context.Context) error {
		var err error
		elapsed, err = pace(ctx, float64(rate), n, func(int) error {
			m := r.bare.next(1)[0]
			t.sent(wire.EventIDOf(m.Header.Get(wire.HeaderMsgID)))
			return r.publish(m)
		})
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	return t, elapsed, t.wait(ctx, time.Now().Add(ReceiptTimeout))
}
