package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// Postgres goes away for a few seconds while events are published: they are
// committed once it is back, and none gets a verdict it did not deserve.
func TestDatabaseOutageDelaysButNeverMisjudges(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	proxy := faultproxy.Start(t, "127.0.0.1:5432")
	pool := db.PoolVia(t, proxy.Addr())
	store, err := fence.New(pool, fence.Config{})
	require.NoError(t, err)

	ns := natstest.Start(t)
	e := &env{t: t, db: db, store: store, ns: ns, nc: ns.Conn(t), js: ns.JetStream(t)}
	e.svc = e.startIngest(ingest.Config{RetryMin: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond})
	rc := e.receipts("worker-a.1")
	l := e.acquire(6, "worker-a.1", 120000)

	proxy.Cut()
	var ids []string
	for v := int64(1); v <= 30; v++ {
		ev := event{id: newID(), partition: 6, task: "outage", holder: "worker-a.1", generation: l.Generation, version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
		ids = append(ids, ev.id)
		e.publish(ev)
	}
	time.Sleep(2 * time.Second) // the database stays away; the ingest keeps retrying
	require.Zero(t, e.count(`SELECT count(*) FROM ledger.events`))
	require.Zero(t, rc.count(), "a verdict was given while the database was down")
	proxy.Restore()

	for _, id := range ids {
		r := receiptFor(t, rc, id)
		require.Equal(t, wire.VerdictCommitted, r.Verdict, "event %s", id)
	}
	require.Equal(t, 30, e.count(`SELECT count(*) FROM ledger.events`))
	require.Empty(t, e.streamMsgs(wire.StreamDLQ, ""))
}

// Two ingest processes on one consumer end with the same log as one would:
// every event committed once, versions dense, the log complete.
func TestTwoIngestProcessesProduceTheSameLogAsOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	e.startIngest(ingest.Config{}) // a second process on the same durable consumer
	rc := e.receipts("worker-a.1")
	const tasks, versions = 8, 25
	var ids []string
	for p := 0; p < 4; p++ {
		l := e.acquire(p, "worker-a.1", 120000)
		for task := p; task < tasks; task += 4 {
			for v := int64(1); v <= versions; v++ {
				ev := event{id: newID(), partition: p, task: fmt.Sprintf("task-%d", task), holder: "worker-a.1",
					generation: l.Generation, version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
				ids = append(ids, ev.id)
				e.msgAsync(ev)
			}
		}
	}
	e.waitAsync()
	for _, id := range ids {
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, id).Verdict)
	}
	require.Equal(t, tasks*versions, e.count(`SELECT count(*) FROM ledger.events`))
	require.Equal(t, tasks, e.count(`SELECT count(*) FROM (SELECT task_id FROM ledger.events GROUP BY task_id
		HAVING max(version) = $1 AND count(*) = $1) dense`, versions))
	require.Len(t, e.streamMsgs(wire.StreamLog, ""), tasks*versions)
	require.Empty(t, e.streamMsgs(wire.StreamDLQ, ""))
}

// A three-node JetStream cluster with replicated streams loses a node while
// events flow: every event whose publish was acknowledged is committed.
func TestClusterNodeLossLosesNoAcknowledgedEvent(t *testing.T) {
	t.Parallel()
	cl := natstest.StartCluster(t, 3)
	db := dbtest.New(t)
	store, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	nc := cl.Conn(t, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	svc, err := ingest.New(ingest.Config{Replicas: 3}, ingest.Deps{NC: cl.Conn(t, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond)), Store: store, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	e := &env{t: t, db: db, store: store, nc: nc}
	e.js, err = jetstream.New(nc)
	require.NoError(t, err)
	cl.WaitStreamCurrent(t, wire.StreamIn)
	// The lease service's subscriptions reach the other nodes over the
	// routes a moment after Start; until then a request there has no
	// responders.
	require.Eventually(t, func() bool {
		_, err := nc.Request(e.subj.LeaseGet(), []byte(`{"partition":2}`), time.Second)
		return !errors.Is(err, nats.ErrNoResponders)
	}, 10*time.Second, 20*time.Millisecond)
	l := e.acquire(2, "worker-a.1", 120000)

	victim := cl.StreamLeader(wire.StreamIn)
	var acked []string
	for v := int64(1); v <= 120; v++ {
		if v == 40 {
			cl.Kill(victim) // the stream leader crashes mid-flow, with no hand-over
		}
		ev := event{id: newID(), partition: 2, task: "cluster", holder: "worker-a.1", generation: l.Generation, version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
		// A publisher retries a failed publish with the same event id until
		// it is acknowledged, as the SDK does.
		require.Eventually(t, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := e.js.PublishMsg(ctx, e.msg(ev))
			return err == nil
		}, 30*time.Second, 50*time.Millisecond, "publish of version %d never acknowledged", v)
		acked = append(acked, ev.id)
	}
	if !assert.Eventually(t, func() bool { return e.count(`SELECT count(*) FROM ledger.events`) == len(acked) }, 60*time.Second, 100*time.Millisecond) {
		var have []int64
		rows, _ := db.Pool.Query(context.Background(), `SELECT version FROM ledger.events ORDER BY version`)
		for rows.Next() {
			var v int64
			_ = rows.Scan(&v)
			have = append(have, v)
		}
		rows.Close()
		t.Logf("committed versions: %v", have)
		if s, err := e.js.Stream(context.Background(), wire.StreamIn); err == nil {
			if info, err := s.Info(context.Background()); err == nil {
				t.Logf("LEDGER_IN state: %+v leader=%v", info.State, info.Cluster)
			}
			list := s.ListConsumers(context.Background())
			for ci := range list.Info() {
				t.Logf("consumer %s: delivered=%+v ackfloor=%+v pending=%d ackpending=%d redelivered=%d waiting=%d cluster=%+v",
					ci.Name, ci.Delivered, ci.AckFloor, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, ci.Cluster)
			}
		}
		t.FailNow()
	}
	require.Equal(t, len(acked), e.count(`SELECT count(*) FROM ledger.events WHERE event_id = ANY($1)`, acked))
}
