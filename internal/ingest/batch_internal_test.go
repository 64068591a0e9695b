package ingest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// A batch of the partition stored before an event counts as a maybe for
// the event's gap check: its tasks are not known without reading it, so it
// delays the gap verdict. A batch stored after the event does not.
// Switch: hooks.noBatchGapCheck (the earlier batch is then not seen).
func TestEarlierBatchOfThePartitionDelaysTheGap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := natstest.Start(t).JetStream(t)
	require.NoError(t, streams.Apply(ctx, js, streams.Options{Partitions: 2}))
	st, err := js.Stream(ctx, wire.StreamIn)
	require.NoError(t, err)
	subj := wire.Subjects{}
	s := &Service{inboxes: inboxSet{byName: map[string]jetstream.Stream{wire.StreamIn: st}}, subjects: subj,
		cfg: Config{}.WithDefaults(), log: ledgertest.Logger()}

	batchOf := func(p int, id string) {
		m, err := subj.BatchMsg([]wire.Inbound{{ID: id, Partition: p, Task: "other", Holder: "w.1", Generation: 1,
			Version: 1, Type: "x"}})
		require.NoError(t, err)
		_, err = js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	single := func(task string) *inbound {
		in := wire.Inbound{ID: ledgertest.NewID(), Partition: 1, Task: task, Holder: "w.1", Generation: 1,
			Version: 2, Type: "x"}
		ack, err := js.PublishMsg(ctx, subj.InboundMsg(in))
		require.NoError(t, err)
		return &inbound{sourceSeq: ack.Sequence, event: fence.Event{Partition: 1, Task: task, Version: 2}}
	}
	batchOf(0, ledgertest.NewID()) // another partition's batch is no predecessor
	first := single("gap-a")
	require.False(t, s.earlierPending(ctx, first), "nothing of the partition came before it")
	batchOf(1, ledgertest.NewID())
	later := single("gap-b") // no earlier message of its own task
	require.False(t, s.earlierPending(ctx, first), "the batch came after it")
	require.True(t, s.earlierPending(ctx, later), "the batch before it may hold its predecessor")
}

// With an inbox per principal, a task's earlier message waiting in another
// principal's inbox (a task that has no owner yet, or shared tasks) still
// delays the gap verdict if it was stored first. Sequences of two streams
// do not compare, so the other inbox is asked by time: a message stored
// after the event does not delay it.
// Switch: queuedBefore asking only the event's own stream.
func TestEarlierVersionInAnotherPrincipalsInboxDelaysTheGap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := natstest.Start(t).JetStream(t)
	require.NoError(t, streams.Apply(ctx, js, streams.Options{Partitions: 2, Principals: []string{"a", "b"}}))
	s := &Service{inboxes: inboxSet{byName: map[string]jetstream.Stream{}}, subjects: wire.Subjects{},
		cfg: Config{}.WithDefaults(), log: ledgertest.Logger()}
	for _, n := range []string{"LEDGER_IN_a", "LEDGER_IN_b"} {
		st, err := js.Stream(ctx, n)
		require.NoError(t, err)
		s.inboxes.byName[n] = st
	}
	publish := func(holder, task string, version int64) *inbound {
		in := wire.Inbound{ID: ledgertest.NewID(), Partition: 1, Task: task, Holder: holder, Generation: 1,
			Version: version, Type: "x"}
		ack, err := js.PublishMsg(ctx, wire.Subjects{}.InboundMsg(in))
		require.NoError(t, err)
		st, err := js.Stream(ctx, ack.Stream)
		require.NoError(t, err)
		m, err := st.GetMsg(ctx, ack.Sequence)
		require.NoError(t, err)
		return &inbound{stream: ack.Stream, sourceSeq: ack.Sequence, published: m.Time,
			event: fence.Event{Partition: 1, Task: task, Version: version}}
	}
	publish("a.1", "shared", 1)
	waiting := publish("b.1", "shared", 2)
	require.True(t, s.earlierPending(ctx, waiting), "a's version 1, stored first, may still commit")
	early := publish("b.1", "late", 2)
	publish("a.1", "late", 1)
	require.False(t, s.earlierPending(ctx, early), "a message stored after the event is no predecessor it waited for")
}
