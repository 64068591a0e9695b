package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// Workers publish through the SDK; A loses its lease to B; a late message of
// A's old generation arrives after the takeover. Every task's projection ends
// equal to the fold of its committed events, and the late write is refused.
func TestPipelineWithTakeoverEndsWithProjectionsEqualToTheLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	ns := natstest.Start(t)
	store, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	log := slog.New(slog.DiscardHandler)
	in, err := ingest.New(ingest.Config{}, ingest.Deps{NC: ns.Conn(t), Store: store, Logger: log})
	require.NoError(t, err)
	require.NoError(t, in.Start(ctx))
	t.Cleanup(in.Stop)
	proj, err := projector.New(projector.Config{Engine: projection.Config{GapTimeout: 500 * time.Millisecond}},
		projector.Deps{NC: ns.Conn(t), Pool: db.Pool, Logger: log})
	require.NoError(t, err)
	require.NoError(t, proj.Start(ctx))
	t.Cleanup(proj.Stop)

	const partition = 3
	tasks := []string{"report-1", "report-2", "report-3"}
	publish := func(l *worker.Lease, task, typ string, payload any) *worker.Pending {
		t.Helper()
		b, _ := json.Marshal(payload)
		p, err := l.Publish(ctx, task, typ, b)
		require.NoError(t, err)
		return p
	}
	waitCommitted := func(ps ...*worker.Pending) {
		t.Helper()
		for _, p := range ps {
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			require.NoError(t, p.Wait(wctx), "event %s of %s", p.ID(), p.Task())
			cancel()
		}
	}

	// Worker A holds the partition and writes the first versions.
	a, err := worker.New(ns.Conn(t, worker.InboxOption("worker-a.1")), worker.Config{Holder: "worker-a.1", TTL: 500 * time.Millisecond, Logger: log})
	require.NoError(t, err)
	la, err := a.Acquire(ctx, partition)
	require.NoError(t, err)
	var ps []*worker.Pending
	for i, task := range tasks {
		ps = append(ps, publish(la, task, "running", map[string]any{"owner": "a", "step": 1}))
		for v := 2; v <= 2+i; v++ {
			ps = append(ps, publish(la, task, "progress", map[string]any{"step": v, fmt.Sprintf("k%d", v): true}))
		}
	}
	waitCommitted(ps...)
	oldGen := la.Generation()
	require.NoError(t, a.Close()) // A stops renewing, as if paused

	// B, a standby of the same principal (a task is its first writer's),
	// takes the partition over once A's lease has expired.
	b, err := worker.New(ns.Conn(t, worker.InboxOption("worker-a.2")), worker.Config{Holder: "worker-a.2", Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	var lb *worker.Lease
	require.Eventually(t, func() bool {
		lb, err = b.Acquire(ctx, partition)
		return err == nil
	}, 10*time.Second, 50*time.Millisecond)
	require.Greater(t, lb.Generation(), oldGen)
	ps = nil
	for _, task := range tasks {
		ps = append(ps, publish(lb, task, "completed", map[string]any{"owner": "b", "result": task + "-done"}))
	}
	waitCommitted(ps...)

	// A's zombie: a message of its old generation arrives after the takeover.
	nc := ns.Conn(t)
	receipts, err := nc.SubscribeSync(wire.Subjects{}.Receipt("worker-a.1"))
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	head, err := store.TaskHead(ctx, tasks[0])
	require.NoError(t, err)
	lateID := ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String()
	late := wire.Subjects{}.InboundMsg(wire.Inbound{ID: lateID, Partition: partition, Task: tasks[0], Holder: "worker-a.1",
		Generation: oldGen, Version: head.Version + 1, Type: "completed", Payload: []byte(`{"owner":"a","result":"stale"}`)})
	js := ns.JetStream(t)
	_, err = js.PublishMsg(ctx, late)
	require.NoError(t, err)
	m, err := receipts.NextMsg(20 * time.Second)
	require.NoError(t, err)
	var r wire.Receipt
	require.NoError(t, json.Unmarshal(m.Data, &r))
	require.Equal(t, lateID, r.EventID)
	require.Equal(t, wire.VerdictStale, r.Verdict)
	require.Equal(t, wire.ReasonSuperseded, r.Reason)

	// Every task's projection equals the fold of its committed events.
	kv, err := js.KeyValue(ctx, wire.BucketTasks)
	require.NoError(t, err)
	for _, task := range tasks {
		rows, err := db.Pool.Query(ctx, `SELECT version, seq, type, payload::text, holder FROM ledger.events WHERE task_id = $1 ORDER BY version`, task)
		require.NoError(t, err)
		var status string
		var data json.RawMessage
		var version, seq int64
		for rows.Next() {
			var typ, payload, holder string
			require.NoError(t, rows.Scan(&version, &seq, &typ, &payload, &holder))
			status = typ
			data, err = projection.MergePatch(data, json.RawMessage(payload))
			require.NoError(t, err)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, "completed", status, "B's result is the last committed event of %s", task)

		var st projection.State
		require.Eventually(t, func() bool {
			entry, err := kv.Get(ctx, task)
			if err != nil {
				return false
			}
			require.NoError(t, json.Unmarshal(entry.Value(), &st))
			return st.Version == version
		}, 20*time.Second, 20*time.Millisecond, "projection of %s never reached version %d", task, version)
		require.Equal(t, status, st.Status, task)
		require.Equal(t, seq, st.Seq, task)
		require.Equal(t, partition, st.Partition, task)
		require.JSONEq(t, string(data), string(st.Data), task)
		require.Nil(t, st.Gap, task)
		var result map[string]any
		require.NoError(t, json.Unmarshal(st.Data, &result))
		require.Equal(t, "b", result["owner"], "the projection keeps B's result for %s", task)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger.events e JOIN ledger.lease_grants g
		ON g.partition = e.partition AND g.generation = $1 WHERE e.generation < $1 AND e.committed_at >= g.granted_at`,
		lb.Generation()).Scan(&n))
	require.Zero(t, n, "no event of the old generation is committed after B's grant")
}
