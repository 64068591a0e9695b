package ingest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

// A partition's consumer deleted from the server while the ingest holds
// the partition (an operator's `nats consumer rm`, a server that lost it)
// is made again on a later beat, and the partition's events go on being
// decided: one published after the delete commits.
// Switch: TestHooks.NoRevive (the event is never decided).
func TestAPartitionsVanishedConsumerIsMadeAgain(t *testing.T) {
	t.Parallel()
	e, commit := commitsOnePartition(t, 2)
	commit(1)
	ctx := context.Background()

	st, err := e.js.Stream(ctx, wire.StreamIn)
	require.NoError(t, err)
	names := st.ConsumerNames(ctx)
	deleted := 0
	for n := range names.Name() {
		require.NoError(t, e.js.DeleteConsumer(ctx, wire.StreamIn, n))
		deleted++
	}
	require.NoError(t, names.Err())
	require.Positive(t, deleted)

	commit(2)
}

// The partition consumers keep their state in the server's memory
// (consumer_ingest.json, mem_storage): a restarted server has none of
// them. The ingest makes them again after it reconnects, and the events
// still in LEDGER_IN, and those published after the restart, are decided.
// Switch: TestHooks.NoRevive (the event published after the restart is
// never decided).
func TestConsumersKeptInMemoryAreMadeAgainAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	e, commit := commitsOnePartition(t, 3)
	commit(1)
	e.ns.Restart(t)
	commit(2)
}

// commitsOnePartition starts an ingest and leases partition p to w.1;
// commit publishes version v of task t-1 there and waits for it to commit.
func commitsOnePartition(t *testing.T, p int) (e *env, commit func(v int64)) {
	e = newBareEnv(t)
	e.svc = e.startIngest(ingest.Config{})
	rc := e.receipts("w.1")
	l := e.acquire(p, "w.1", 120000)
	return e, func(v int64) {
		ev := event{id: newID(), partition: p, task: "t-1", holder: "w.1", generation: l.Generation, version: v, typ: "x"}
		e.publish(ev)
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, ev.id).Verdict)
	}
}
