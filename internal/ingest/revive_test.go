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
	e := newBareEnv(t)
	e.svc = e.startIngest(ingest.Config{})
	rc := e.receipts("w.1")
	l := e.acquire(2, "w.1", 60000)
	ctx := context.Background()
	first := event{id: newID(), partition: 2, task: "t-1", holder: "w.1", generation: l.Generation, version: 1, typ: "x"}
	e.publish(first)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, first.id).Verdict)

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

	next := event{id: newID(), partition: 2, task: "t-1", holder: "w.1", generation: l.Generation, version: 2, typ: "x"}
	e.publish(next)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, next.id).Verdict)
}

// The partition consumers keep their state in the server's memory
// (consumer_ingest.json, mem_storage): a restarted server has none of
// them. The ingest makes them again after it reconnects, and the events
// still in LEDGER_IN, and those published after the restart, are decided.
// Switch: TestHooks.NoRevive (the event published after the restart is
// never decided).
func TestConsumersKeptInMemoryAreMadeAgainAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	e.svc = e.startIngest(ingest.Config{})
	rc := e.receipts("w.1")
	l := e.acquire(3, "w.1", 120000)
	first := event{id: newID(), partition: 3, task: "t-1", holder: "w.1", generation: l.Generation, version: 1, typ: "x"}
	e.publish(first)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, first.id).Verdict)

	e.ns.Restart(t)
	next := event{id: newID(), partition: 3, task: "t-1", holder: "w.1", generation: l.Generation, version: 2, typ: "x"}
	e.publish(next)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, next.id).Verdict)
}
