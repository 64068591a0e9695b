package ingest

import (
	"context"
	"testing"

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
	s := &Service{inStream: st, subjects: subj, cfg: Config{}.WithDefaults(), log: ledgertest.Logger()}

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
