package ingest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// Through the whole pipeline: on a partition in observe mode a zombie's
// event commits, and its receipt, its LEDGER_LOG copy and the metrics say
// would_reject stale/superseded; every receipt names the effective mode,
// and nothing is dead-lettered.
func TestObservedZombieWriteIsToldInReceiptLogCopyAndMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	ctx := context.Background()
	ra, rb := e.receipts("worker-a.1"), e.receipts("worker-a.2")
	a := e.acquire(2, "worker-a.1", 120000)
	first := event{id: newID(), partition: 2, task: "job-1", holder: "worker-a.1", generation: a.Generation, version: 1, typ: "running", payload: `{}`}
	e.publish(first)
	require.Equal(t, "enforce", receiptFor(t, ra, first.id).FenceMode)

	_, err := fence.SetFenceMode(ctx, e.db.Pool, 2, fence.ModeObserve, "ops", "rollout")
	require.NoError(t, err)
	e.expire(2)
	b := e.acquire(2, "worker-a.2", 120000)
	second := event{id: newID(), partition: 2, task: "job-1", holder: "worker-a.2", generation: b.Generation, version: 2, typ: "running", payload: `{}`}
	e.publish(second)
	r := receiptFor(t, rb, second.id)
	require.Equal(t, wire.VerdictCommitted, r.Verdict)
	require.Equal(t, "observe", r.FenceMode)
	require.Empty(t, r.WouldReject)

	zombie := event{id: newID(), partition: 2, task: "job-1", holder: "worker-a.1", generation: a.Generation, version: 3, typ: "completed", payload: `{"late":true}`}
	e.publish(zombie)
	r = receiptFor(t, ra, zombie.id)
	require.Equal(t, wire.VerdictCommitted, r.Verdict)
	require.Equal(t, "observe", r.FenceMode)
	require.Equal(t, "stale/superseded", r.WouldReject)
	require.Equal(t, b.Generation, r.CurrentGeneration)

	copies := e.streamMsgs(wire.StreamLog, e.subj.Log(2, "job-1"))
	require.Len(t, copies, 3)
	require.Equal(t, "stale/superseded", copies[2].Headers().Get(wire.HeaderWouldReject))
	require.Empty(t, copies[1].Headers().Get(wire.HeaderWouldReject))
	require.Empty(t, e.streamMsgs(wire.StreamDLQ, ""), "observe dead-letters nothing the fence would refuse")

	require.Equal(t, 1.0, ingest.WouldRejectCount(e.svc, "stale/superseded"))
}
