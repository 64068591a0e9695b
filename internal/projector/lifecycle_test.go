package projector_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// The engine evicts idle tasks while a task stays resident; the projector
// forgets the bucket revisions of the evicted tasks only. The resident
// task's next write, the one that opens its gap, goes through at the first
// compare-and-set, the gap is stored with its marker, and a projector that
// starts after this one died finishes the task from PostgreSQL.
func TestTrimKeepsTheRevisionOfAResidentTaskSoItsGapIsStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := e.commit(1, "g", []string{"a", "b", "c"}, []string{`{"a":1}`, `{"b":2}`, `{"c":3}`})
	var others []committed
	for k := range 5 {
		others = append(others, e.commit(2, fmt.Sprintf("o-%d", k), []string{"x"}, []string{`{}`})...)
	}
	reg := prometheus.NewRegistry()
	p := e.newProjector(projector.Config{Engine: projection.Config{MaxTasks: 1, GapTimeout: time.Hour}}, reg)
	ctx := context.Background()
	cons, err := p.Prepare(ctx)
	require.NoError(t, err)

	e.publishLog(g[0])
	p.Turn(ctx, fetch(t, cons, 1))
	for _, o := range others {
		e.publishLog(o)
	}
	e.publishLog(g[0]) // a copy again, so g is the task offered last and the trim keeps it
	p.Turn(ctx, fetch(t, cons, 6))
	require.EqualValues(t, 1, metric(t, reg, "ledger_projector_tasks_in_memory"), "the trim evicted the others")

	e.publishLog(g[2]) // version 3 before 2: a gap opens
	p.Turn(ctx, fetch(t, cons, 1))
	st, ok := e.state("g")
	require.True(t, ok)
	require.EqualValues(t, 1, st.Version)
	require.NotNil(t, st.Gap, "the gap is stored")
	require.EqualValues(t, 2, st.Gap.NextVersion)
	require.Zero(t, metric(t, reg, "ledger_projector_kv_retries_total"), "no compare-and-set failed: g's revision was kept")

	e.start(projector.Config{Engine: projection.Config{GapTimeout: 200 * time.Millisecond}})
	st = e.waitState("g", 10*time.Second, func(s projection.State) bool { return s.Version == 3 && s.Gap == nil })
	_, data := fold(t, g)
	jsonEq(t, data, st.Data, "g")
}

// Stop is safe without Start, and a stopped projector does not start.
func TestStopWithoutStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	idle := e.newProjector(projector.Config{}, nil)
	returns(t, "Stop without Start", idle.Stop)
	require.Error(t, idle.Start(context.Background()), "a stopped projector does not start")
}

// Stop is safe twice, on a projector that runs and on one that never did.
func TestStopTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	idle := e.newProjector(projector.Config{}, nil)
	running := e.start(projector.Config{})
	returns(t, "Stop twice without Start", func() { idle.Stop(); idle.Stop() })
	returns(t, "Stop twice", func() { running.Stop(); running.Stop() })
}

// A turn hangs on a database that answers nothing while the log keeps
// coming, so the consume callback has a full channel in front of it. Stop
// returns within its StopTimeout all the same, the callback is released, and
// nothing the hung projector held is lost.
func TestStopIsBoundedWhileATurnHangs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy, pool := proxiedPool(t, e.db.URL)
	stuck := e.commit(1, "stuck", []string{"a", "b", "c"}, []string{`{"a":1}`, `{"b":2}`, `{"c":3}`})
	var later []committed
	for k := range 10 {
		later = append(later, e.commit(2, fmt.Sprintf("later-%d", k), []string{"x"}, []string{`{"k":1}`})...)
	}
	closed := make(chan struct{})
	nc := e.ns.Conn(t, nats.DrainTimeout(time.Minute), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	p, err := projector.New(projector.Config{BatchSize: 2, StopTimeout: 500 * time.Millisecond,
		Engine: projection.Config{GapTimeout: 300 * time.Millisecond}},
		projector.Deps{NC: nc, Pool: pool, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(p.Stop)

	// Silenced first, so the re-fetch of version 2, due 300 ms after the
	// gap, hangs however late this test gets to look at the gap (the
	// projector needs the database for nothing else here).
	proxy.Silence()
	e.publishLog(stuck[0])
	e.publishLog(stuck[2])
	e.waitState("stuck", 10*time.Second, func(s projection.State) bool { return s.Gap != nil })
	time.Sleep(time.Second)
	for _, c := range later {
		e.publishLog(c)
	}
	cons, err := e.js.Consumer(context.Background(), "LEDGER_LOG", "projector")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(context.Background())
		// 2 handled, 4 in the channel (2 × batch size), 1 in the callback
		return err == nil && info.Delivered.Consumer >= 7
	}, 10*time.Second, 10*time.Millisecond)

	returns(t, "Stop while a turn hangs", p.Stop)
	// A connection drains only once its handlers return: a consume callback
	// blocked on a channel nobody reads would hold it for the drain timeout.
	require.NoError(t, nc.Drain())
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection did not drain: the consume callback is still blocked after Stop")
	}

	proxy.Restore()
	e.start(projector.Config{Engine: projection.Config{GapTimeout: 300 * time.Millisecond}})
	e.waitState("stuck", 10*time.Second, func(s projection.State) bool { return s.Version == 3 })
	for _, c := range later {
		e.waitState(c.task, 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	}
}

// returns runs f and fails the test unless it returns within 5 s.
func returns(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not return within 5 s", what)
	}
}

// proxiedPool is a pool on the test's database through a fault proxy.
func proxiedPool(t *testing.T, url string) (*faultproxy.Proxy, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	proxy := faultproxy.Start(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return proxy, pool
}

// A turn hangs on a database that answers nothing while it loads the task
// of the message in hand. Stop returns within its StopTimeout all the same,
// and that message is handed back by then: a projector that starts after
// this one's connection is closed, as when its process exits, projects the
// message at once, not after the ack wait. The log handler takes its time
// with the line the cancelled turn writes before it hands the message back,
// as a turn that takes a moment to wind down would.
func TestStopHandsBackTheMessageInHand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	proxy, pool := proxiedPool(t, e.db.URL)
	evs := e.commit(1, "c", []string{"x", "y"}, []string{`{"a":1}`, `{"b":2}`})
	_, err := streams.ApplyBucket(ctx, e.js, wire.BucketTasks, streams.Options{})
	require.NoError(t, err)
	// Not a projection: loading it folds the task again from PostgreSQL.
	_, err = e.bucket().Put(ctx, "c", []byte(`{"task":"c","version":-7}`))
	require.NoError(t, err)
	logs := &logBuffer{}
	log := slog.New(slowHandler{Handler: logs.logger().Handler(), msg: msgRedelivered, delay: time.Second})
	nc := e.ns.Conn(t)
	p, err := projector.New(projector.Config{StopTimeout: 500 * time.Millisecond, AckWait: time.Hour},
		projector.Deps{NC: nc, Pool: pool, Logger: log})
	require.NoError(t, err)
	require.NoError(t, p.Start(ctx))
	t.Cleanup(p.Stop)

	proxy.Silence()
	e.publishLog(evs[1])
	require.Eventually(t, func() bool { return logs.count(msgRefold) == 1 }, 10*time.Second, 10*time.Millisecond,
		"the turn reads the task from PostgreSQL")
	returns(t, "Stop while a turn hangs", p.Stop)
	nc.Close()

	proxy.Restore()
	e.start(projector.Config{})
	st := e.waitState("c", 10*time.Second, func(s projection.State) bool { return s.Version == 2 })
	_, data := fold(t, evs)
	jsonEq(t, data, st.Data, "c")
}

// What the projector logs as it folds a task again from PostgreSQL because
// its stored value is not a projection, and as it gives back a message
// whose task it could not load.
const (
	msgRefold      = "stored value is not a projection of its task; folding the task again from PostgreSQL"
	msgRedelivered = "loading a projection failed; the event is redelivered"
)

// slowHandler takes delay over each record with the message msg.
type slowHandler struct {
	slog.Handler
	msg   string
	delay time.Duration
}

func (h slowHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		time.Sleep(h.delay)
	}
	return h.Handler.Handle(ctx, r)
}

// slowReads is a bucket whose reads take a while, and which records how
// many were in flight at once.
type slowReads struct {
	jetstream.KeyValue
	inFlight, most atomic.Int32
	reads          atomic.Int32
	fail           atomic.Pointer[string] // a key whose reads fail
}

func (b *slowReads) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if f := b.fail.Load(); f != nil && *f == key {
		return nil, errors.New("the bucket read failed")
	}
	n := b.inFlight.Add(1)
	defer b.inFlight.Add(-1)
	for m := b.most.Load(); n > m && !b.most.CompareAndSwap(m, n); m = b.most.Load() {
	}
	b.reads.Add(1)
	time.Sleep(20 * time.Millisecond)
	return b.KeyValue.Get(ctx, key)
}

// A batch of new tasks reads their values from the bucket side by side, not
// one round trip after another, and folds each from what was read: a task
// with a stored value resumes from it, a new one starts empty.
func TestNewTasksOfABatchAreReadTogether(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const tasks = 20
	var evs []committed
	for k := range tasks {
		evs = append(evs, e.commit(3, fmt.Sprintf("new-%d", k), []string{"x", "y"}, []string{`{"a":1}`, `{"b":2}`})...)
	}
	p := e.newProjector(projector.Config{}, nil)
	ctx := context.Background()
	cons, err := p.Prepare(ctx)
	require.NoError(t, err)
	slow := &slowReads{}
	p.WrapBucket(func(kv jetstream.KeyValue) jetstream.KeyValue { slow.KeyValue = kv; return slow })

	// Version 1 of every task, then (a fresh projector, nothing resident)
	// version 2 of every task: the second batch resumes each from its value.
	for k := range tasks {
		e.publishLog(evs[2*k])
	}
	p.Turn(ctx, fetch(t, cons, tasks))
	require.EqualValues(t, tasks, slow.reads.Load(), "each new task's value was read once")
	require.Greater(t, slow.most.Load(), int32(1), "the reads of one batch ran side by side")

	q := e.newProjector(projector.Config{}, nil)
	cons2, err := q.Prepare(ctx)
	require.NoError(t, err)
	slow2 := &slowReads{}
	q.WrapBucket(func(kv jetstream.KeyValue) jetstream.KeyValue { slow2.KeyValue = kv; return slow2 })
	for k := range tasks {
		e.publishLog(evs[2*k+1])
	}
	q.Turn(ctx, fetch(t, cons2, tasks))
	require.Greater(t, slow2.most.Load(), int32(1))
	for k := range tasks {
		task := fmt.Sprintf("new-%d", k)
		st, ok := e.state(task)
		require.True(t, ok, task)
		require.EqualValues(t, 2, st.Version, "%s resumed from its stored version 1", task)
		jsonEq(t, json.RawMessage(`{"a":1,"b":2}`), st.Data, task)
	}
}

// One failed read of a batch read together holds back that task's event
// alone: it is redelivered, the batch's other tasks are projected, and once
// the read succeeds the task is projected too.
func TestFailedReadAheadRedeliversOnlyItsTask(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var evs []committed
	for k := range 4 {
		evs = append(evs, e.commit(3, fmt.Sprintf("rd-%d", k), []string{"x"}, []string{`{"a":1}`})...)
	}
	p := e.newProjector(projector.Config{RetryMin: 10 * time.Millisecond, RetryMax: 10 * time.Millisecond}, nil)
	ctx := context.Background()
	cons, err := p.Prepare(ctx)
	require.NoError(t, err)
	slow := &slowReads{}
	bad := "rd-2"
	slow.fail.Store(&bad)
	p.WrapBucket(func(kv jetstream.KeyValue) jetstream.KeyValue { slow.KeyValue = kv; return slow })
	for _, c := range evs {
		e.publishLog(c)
	}
	p.Turn(ctx, fetch(t, cons, len(evs)))
	for k := range 4 {
		_, ok := e.state(fmt.Sprintf("rd-%d", k))
		require.Equal(t, k != 2, ok, "rd-%d", k)
	}
	slow.fail.Store(nil)
	again := fetch(t, cons, 1) // rd-2's event, handed back
	p.Turn(ctx, again)
	st, ok := e.state("rd-2")
	require.True(t, ok)
	require.EqualValues(t, 1, st.Version)
}
