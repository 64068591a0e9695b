package projector_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// env is one test's ledger: its own database, an embedded NATS server with
// the ledger's streams and bucket.
type env struct {
	t    testing.TB
	db   *dbtest.DB
	ns   *natstest.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	subj wire.Subjects
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{t: t, db: dbtest.New(t), ns: natstest.Start(t)}
	e.nc = e.ns.Conn(t)
	e.js = e.ns.JetStream(t)
	require.NoError(t, streams.Apply(context.Background(), e.js, streams.Options{}))
	return e
}

// start runs a projector on the test's services.
func (e *env) start(cfg projector.Config) *projector.Service {
	e.t.Helper()
	return e.startWith(cfg, nil)
}

// startWith runs a projector that records its metrics in reg.
func (e *env) startWith(cfg projector.Config, reg *prometheus.Registry) *projector.Service {
	e.t.Helper()
	p := e.newProjector(cfg, reg)
	require.NoError(e.t, p.Start(context.Background()))
	return p
}

// startLogged runs a projector with the default config whose log the test
// reads.
func (e *env) startLogged() *logBuffer {
	e.t.Helper()
	logs := &logBuffer{}
	p, err := projector.New(projector.Config{}, projector.Deps{NC: e.ns.Conn(e.t), Pool: e.db.Pool, Logger: logs.logger()})
	require.NoError(e.t, err)
	require.NoError(e.t, p.Start(context.Background()))
	e.t.Cleanup(p.Stop)
	return logs
}

// newProjector returns a projector that is not started yet.
func (e *env) newProjector(cfg projector.Config, reg *prometheus.Registry) *projector.Service {
	e.t.Helper()
	deps := projector.Deps{NC: e.ns.Conn(e.t), Pool: e.db.Pool, Logger: ledgertest.Logger()}
	if reg != nil {
		deps.Registerer = reg
	}
	p, err := projector.New(cfg, deps)
	require.NoError(e.t, err)
	e.t.Cleanup(p.Stop)
	return p
}

// metric reads a counter or gauge of reg, the one whose labels include
// labels (name, value pairs); 0 if it has none yet.
func metric(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for k := 0; k+1 < len(labels); k += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[k] && l.GetValue() == labels[k+1])
				}
				if !found {
					continue series
				}
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

// waitMetric waits until a metric of reg reaches at least want.
func waitMetric(t testing.TB, reg *prometheus.Registry, name string, want float64, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, reg, name, labels...) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s%v never reached %v: %v", name, labels, want, metric(t, reg, name, labels...))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fetch takes the next n messages of a consumer.
func fetch(t testing.TB, cons jetstream.Consumer, n int) []jetstream.Msg {
	t.Helper()
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var out []jetstream.Msg
	for m := range batch.Messages() {
		out = append(out, m)
	}
	require.NoError(t, batch.Error())
	require.Len(t, out, n)
	return out
}

// value reads a task's raw value in the bucket as a JSON object.
func (e *env) value(task string) map[string]any {
	e.t.Helper()
	entry, err := e.bucket().Get(context.Background(), task)
	require.NoError(e.t, err)
	var v map[string]any
	require.NoError(e.t, json.Unmarshal(entry.Value(), &v))
	return v
}

// committed is an event as the ledger stored it.
type committed struct {
	id        string
	seq       int64
	partition int
	task      string
	version   int64
	typ       string
	payload   string
}

// commit writes events straight into ledger.events (as the ingest would have)
// and returns them with their seqs.
func (e *env) commit(partition int, task string, types []string, payloads []string) []committed {
	e.t.Helper()
	var head int64
	_ = e.db.Pool.QueryRow(context.Background(), `SELECT coalesce(max(version), 0) FROM ledger.events WHERE task_id = $1`, task).Scan(&head)
	out := make([]committed, len(types))
	for i := range types {
		c := committed{id: ledgertest.NewID(), partition: partition, task: task,
			version: head + int64(i) + 1, typ: types[i], payload: payloads[i]}
		require.NoError(e.t, e.db.Pool.QueryRow(context.Background(), `
			INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
			VALUES ($1, $2, $3, $4, $5, $6::jsonb, 'worker-a.1', 1, clock_timestamp()) RETURNING seq`,
			c.id, c.partition, c.task, c.version, c.typ, c.payload).Scan(&c.seq))
		out[i] = c
	}
	return out
}

// publishLog puts a committed event's copy on LEDGER_LOG, as the ingest does.
func (e *env) publishLog(c committed) {
	e.t.Helper()
	m := e.subj.LogMsg(c.logCopy())
	// A redelivered copy is a new message (the dedup window would drop it).
	m.Header.Set(wire.HeaderMsgID, c.id+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	_, err := e.js.PublishMsg(context.Background(), m)
	require.NoError(e.t, err)
}

// logCopy is c as the ingest puts it on LEDGER_LOG.
func (c committed) logCopy() *wire.LogCopy {
	return &wire.LogCopy{Seq: c.seq, EventID: c.id, Partition: c.partition, Task: c.task, Version: c.version,
		Type: c.typ, Holder: "worker-a.1", Generation: 1, CommittedAt: time.Now(), Payload: []byte(c.payload)}
}

func (e *env) bucket() jetstream.KeyValue {
	e.t.Helper()
	kv, err := e.js.KeyValue(context.Background(), wire.BucketTasks)
	require.NoError(e.t, err)
	return kv
}

// state reads a task's projection; ok is false while it has none.
func (e *env) state(task string) (projection.State, bool) {
	e.t.Helper()
	kv, err := e.js.KeyValue(context.Background(), wire.BucketTasks)
	if err != nil {
		return projection.State{}, false
	}
	entry, err := kv.Get(context.Background(), task)
	if err != nil {
		return projection.State{}, false
	}
	var st projection.State
	require.NoError(e.t, json.Unmarshal(entry.Value(), &st))
	return st, true
}

// waitState waits until the task's projection satisfies cond.
func (e *env) waitState(task string, timeout time.Duration, cond func(projection.State) bool) projection.State {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	var last projection.State
	for time.Now().Before(deadline) {
		if st, ok := e.state(task); ok {
			last = st
			if cond(st) {
				return st
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatalf("projection of %s never reached the expected state; last: %+v", task, last)
	return last
}

// fold is the projection the contract defines: status is the last type,
// data the payloads merged in version order.
func fold(t testing.TB, events []committed) (status string, data json.RawMessage) {
	t.Helper()
	for _, c := range events {
		status = c.typ
		var err error
		data, err = projection.MergePatch(data, json.RawMessage(c.payload))
		require.NoError(t, err)
	}
	return status, data
}

func jsonEq(t testing.TB, want, got json.RawMessage, msg string) {
	t.Helper()
	require.JSONEq(t, string(want), string(got), msg)
}

// logBuffer keeps a service's log lines (JSON), for a test that waits for
// one.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// logger writes to l, every level.
func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// count is how many lines have the message msg.
func (l *logBuffer) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for line := range bytes.Lines(l.buf.Bytes()) {
		var rec struct{ Msg string }
		if json.Unmarshal(line, &rec) == nil && rec.Msg == msg {
			n++
		}
	}
	return n
}
