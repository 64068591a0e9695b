package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// env is one test's ledger: its own database, an embedded NATS server and
// an ingest service on them.
type env struct {
	t     testing.TB
	db    *dbtest.DB
	store *fence.Store
	ns    *natstest.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	svc   *ingest.Service
	cfg   ingest.Config
	subj  wire.Subjects
}

// newEnv starts an ingest with cfg on its own database and NATS server.
func newEnv(t *testing.T, cfg ingest.Config) *env {
	t.Helper()
	e := &env{t: t, db: dbtest.New(t), ns: natstest.Start(t), cfg: cfg}
	var err error
	e.store, err = fence.New(e.db.Pool, fence.Config{})
	require.NoError(t, err)
	e.nc = e.ns.Conn(t)
	e.js = e.ns.JetStream(t)
	e.svc = e.startIngest(cfg)
	return e
}

// startIngest starts one more ingest process on the test's NATS and database.
func (e *env) startIngest(cfg ingest.Config) *ingest.Service {
	e.t.Helper()
	svc, err := ingest.New(cfg, ingest.Deps{NC: e.ns.Conn(e.t), Store: e.store, Logger: ledgertest.Logger()})
	require.NoError(e.t, err)
	require.NoError(e.t, svc.Start(context.Background()))
	e.t.Cleanup(svc.Stop)
	return svc
}

func newID() string { return ledgertest.NewID() }

// event is what a test publishes to LEDGER_IN.
type event struct {
	id         string
	partition  int
	task       string
	holder     string
	generation int64
	version    int64
	typ        string
	payload    string
}

func (e *env) msg(ev event) *nats.Msg {
	return e.subj.InboundMsg(wire.Inbound{ID: ev.id, Partition: ev.partition, Task: ev.task, Holder: ev.holder,
		Generation: ev.generation, Version: ev.version, Type: ev.typ, Payload: []byte(ev.payload)})
}

func (e *env) publish(ev event) {
	e.t.Helper()
	_, err := e.js.PublishMsg(context.Background(), e.msg(ev))
	require.NoError(e.t, err)
}

func (e *env) publishMsg(m *nats.Msg) {
	e.t.Helper()
	_, err := e.js.PublishMsg(context.Background(), m)
	require.NoError(e.t, err)
}

// lease calls the lease service over NATS and decodes a success reply. A
// holder's own operations go to its subject: the "holder" member of req,
// which is sent in the body as well.
func (e *env) lease(op string, req map[string]any) (wire.LeaseReply, *wire.ErrorReply, nats.Header) {
	e.t.Helper()
	b, _ := json.Marshal(req)
	subject := e.subj.LeaseGet()
	if op != "get" {
		holder, _ := req["holder"].(string)
		subject = e.subj.Lease(op, holder)
	}
	resp, err := e.nc.Request(subject, b, 5*time.Second)
	require.NoError(e.t, err)
	if resp.Header.Get("Nats-Service-Error-Code") != "" {
		var er wire.ErrorReply
		require.NoError(e.t, json.Unmarshal(resp.Data, &er), string(resp.Data))
		return wire.LeaseReply{}, &er, resp.Header
	}
	var r wire.LeaseReply
	require.NoError(e.t, json.Unmarshal(resp.Data, &r), string(resp.Data))
	return r, nil, resp.Header
}

func (e *env) acquire(partition int, holder string, ttlMS int64) wire.LeaseReply {
	e.t.Helper()
	r, er, _ := e.lease("acquire", map[string]any{"partition": partition, "holder": holder, "ttl_ms": ttlMS})
	require.Nil(e.t, er, "acquire: %+v", er)
	return r
}

// receiptBook keeps every receipt a holder got, by event id.
type receiptBook struct {
	mu   sync.Mutex
	byID map[string][]wire.Receipt
	all  []wire.Receipt
}

// receipts subscribes to a holder's receipts before anything is published.
func (e *env) receipts(holder string) *receiptBook {
	e.t.Helper()
	b := &receiptBook{byID: map[string][]wire.Receipt{}}
	sub, err := e.nc.Subscribe(e.subj.Receipt(holder), func(m *nats.Msg) {
		var r wire.Receipt
		if json.Unmarshal(m.Data, &r) == nil {
			b.mu.Lock()
			b.byID[r.EventID] = append(b.byID[r.EventID], r)
			b.all = append(b.all, r)
			b.mu.Unlock()
		}
	})
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(e.t, e.nc.Flush())
	return b
}

// count is how many receipts arrived so far.
func (b *receiptBook) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.all)
}

// receiptFor waits for the first receipt of event id.
func receiptFor(t testing.TB, b *receiptBook, id string) wire.Receipt {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		b.mu.Lock()
		rs := b.byID[id]
		b.mu.Unlock()
		if len(rs) > 0 {
			return rs[0]
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no receipt for event %s", id)
	return wire.Receipt{}
}

// logVersions is the version header of each LEDGER_LOG copy of task on
// partition, in stream order.
func (e *env) logVersions(partition int, task string) []string {
	e.t.Helper()
	var versions []string
	for _, m := range e.streamMsgs(wire.StreamLog, e.subj.Log(partition, task)) {
		versions = append(versions, m.Headers().Get(wire.HeaderVersion))
	}
	return versions
}

// ingestDiedBeforeCopy starts an ingest that stores no LEDGER_LOG copy,
// has it commit version 1 of task on partition 8 for worker-a.1, and
// closes its connection: version 1 is in PostgreSQL, its copy nowhere. It
// returns the config to start the next ingest with, worker-a.1's receipts
// and a maker of events of worker-a.1's lease.
func (e *env) ingestDiedBeforeCopy(task string) (ingest.Config, *receiptBook, func(task string, v int64) event) {
	e.t.Helper()
	cfg := ingest.Config{AckWait: 5 * time.Second, StopTimeout: time.Second}
	_, conn := e.startIngestOn(ingest.WithTestHooks(cfg, ingest.TestHooks{DropCopy: func(*nats.Msg) bool { return true }}), e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(8, "worker-a.1", 120000)
	ev := func(task string, v int64) event {
		return event{id: newID(), partition: 8, task: task, holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	e.publish(ev(task, 1))
	require.Eventually(e.t, func() bool { return e.count(`SELECT count(*) FROM ledger.events`) == 1 }, 10*time.Second, 10*time.Millisecond)
	conn.Close() // dies with version 1 committed and its copy not stored
	return cfg, rc, ev
}

// streamMsgs reads every message of a stream (or of one subject filter).
func (e *env) streamMsgs(stream, filter string) []jetstream.Msg {
	e.t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, stream)
	require.NoError(e.t, err)
	info, err := s.Info(ctx)
	require.NoError(e.t, err)
	if info.State.Msgs == 0 {
		return nil
	}
	cfg := jetstream.OrderedConsumerConfig{}
	if filter != "" {
		cfg.FilterSubjects = []string{filter}
	}
	c, err := s.OrderedConsumer(ctx, cfg)
	require.NoError(e.t, err)
	var out []jetstream.Msg
	for {
		batch, err := c.FetchNoWait(1000)
		require.NoError(e.t, err)
		n := 0
		for m := range batch.Messages() {
			out = append(out, m)
			n++
		}
		if n == 0 {
			return out
		}
	}
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	return ledgertest.Count(e.t, e.db.Pool, sql, args...)
}

func (e *env) expire(partition int) {
	e.t.Helper()
	ledgertest.ExpireLease(e.t, e.db.Pool, partition)
}

func payload(v any) string { b, _ := json.Marshal(v); return string(b) }

// streamPending is the number of messages still in a stream (for the
// work-queue LEDGER_IN: not yet acked).
func (e *env) streamPending(stream string) uint64 {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), stream)
	require.NoError(e.t, err)
	info, err := s.Info(context.Background())
	require.NoError(e.t, err)
	return info.State.Msgs
}

// msgAsync publishes without waiting for the ack; waitAsync waits for all.
func (e *env) msgAsync(ev event) {
	e.t.Helper()
	_, err := e.js.PublishMsgAsync(e.msg(ev))
	require.NoError(e.t, err)
}

func (e *env) waitAsync() {
	e.t.Helper()
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		e.t.Fatal("async publishes were not acknowledged")
	}
}
