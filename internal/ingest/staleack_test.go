package ingest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

// A server that lost its unsynced tail gives the lost sequences to new
// messages, and a work queue removes the message of any acked sequence.
// An ingest that took event A before the loss, and acks it after, must not
// remove event B, which now has A's sequence and nobody has judged.
// Switch: TestHooks.StaleAcks, which acks a message taken before a
// reconnect like any other (staleack.go): B is removed unjudged, no receipt.
func TestAckOfAMessageTakenBeforeAStorageLossRemovesNoNewMessage(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold := func() bool {
		held := false
		once.Do(func() { held = true })
		if held {
			close(reached)
			<-release // A is committed and its copy stored; its ack waits
		}
		return true
	}
	cfg := ingest.WithTestHooks(ingest.Config{AckWait: 2 * time.Second, StopTimeout: time.Second},
		ingest.TestHooks{AfterPublish: hold})
	e.startIngestOn(cfg, e.store)
	var released sync.Once
	let := func() { released.Do(func() { close(release) }) }
	t.Cleanup(let) // before the ingest's Stop, which waits for the hook
	rc := e.receipts("worker-a.1")
	l := e.acquire(3, "worker-a.1", 120000)
	ev := func(task string) event {
		return event{id: newID(), partition: 3, task: task, holder: "worker-a.1", generation: l.Generation,
			version: 1, typ: "step", payload: `{"n":1}`}
	}
	a := ev("task-a")
	ack, err := e.js.PublishMsg(context.Background(), e.msg(a))
	require.NoError(t, err)
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the ingest never committed A")
	}

	// The loss: LEDGER_IN's block cut; A's sequence is free again.
	e.loseStreamTail(wire.StreamIn)
	b := ev("task-b")
	var bAck uint64
	require.Eventually(t, func() bool {
		pa, err := e.js.PublishMsg(context.Background(), e.msg(b))
		if err == nil {
			bAck = pa.Sequence
		}
		return err == nil
	}, 20*time.Second, 50*time.Millisecond)
	require.Equal(t, ack.Sequence, bAck, "precondition: B has A's sequence")
	let()

	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, a.id).Verdict)
	r := receiptFor(t, rc, b.id)
	require.Equal(t, wire.VerdictCommitted, r.Verdict, fmt.Sprintf("B: %+v", r))
}

// loseStreamTail stops the NATS server, cuts the newest block file of
// stream to half its size and removes the stream's state file, as a power
// loss leaves a store the server never closed: the server then counts the
// stream's sequences from what its blocks hold, and gives the lost ones
// to new messages.
func (e *env) loseStreamTail(stream string) {
	e.t.Helper()
	e.ns.Shutdown()
	dir := filepath.Join(e.ns.StoreDir(), "jetstream", "*", "streams", stream, "msgs")
	blocks, err := filepath.Glob(filepath.Join(dir, "*.blk"))
	require.NoError(e.t, err)
	require.NotEmpty(e.t, blocks, "the stream's block files")
	slices.SortFunc(blocks, func(a, b string) int { return blockIndex(a) - blockIndex(b) })
	last := blocks[len(blocks)-1]
	info, err := os.Stat(last)
	require.NoError(e.t, err)
	require.NoError(e.t, os.Truncate(last, info.Size()/2))
	states, err := filepath.Glob(filepath.Join(dir, "index.db"))
	require.NoError(e.t, err)
	for _, f := range states {
		require.NoError(e.t, os.Remove(f))
	}
	e.ns.Restart(e.t)
}
