package streams_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// A LEDGER_IN made before batches existed stores only single events; an
// operator's `streams apply` (no partition count) gives each of its
// partitions the batch subject, so a batch publish is stored, not refused.
// Switch: withBatchSubjects returning have unchanged; the batch publish
// then fails with no responders.
func TestApplyGivesAnOldInboxTheBatchSubjects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := natstest.Start(t).JetStream(t)
	subj := wire.Subjects{}
	cfg, err := streams.Stream(wire.StreamIn, streams.Options{})
	require.NoError(t, err)
	cfg.Subjects = []string{subj.InPartition(0), subj.InPartition(1)}
	_, err = js.CreateStream(ctx, cfg)
	require.NoError(t, err)
	batch, err := subj.BatchMsg([]wire.Inbound{{ID: "01JD0000000000000000000001", Partition: 1, Task: "t",
		Holder: "w.1", Generation: 1, Version: 1, Type: "x"}})
	require.NoError(t, err)
	_, err = js.PublishMsg(ctx, batch)
	require.Error(t, err, "an old inbox has no batch subject")

	require.NoError(t, streams.Apply(ctx, js, streams.Options{}))
	st, err := js.Stream(ctx, wire.StreamIn)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{subj.InPartition(0), subj.InPartition(1), subj.InBatchPartition(0),
		subj.InBatchPartition(1)}, st.CachedInfo().Config.Subjects)
	_, err = js.PublishMsg(ctx, batch)
	require.NoError(t, err)
}

// The ingest's partition count gives each partition both subjects.
func TestInboxOfNPartitionsTakesSingleEventsAndBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := natstest.Start(t).JetStream(t)
	require.NoError(t, streams.Apply(ctx, js, streams.Options{Partitions: 2}))
	st, err := js.Stream(ctx, wire.StreamIn)
	require.NoError(t, err)
	subj := wire.Subjects{}
	require.ElementsMatch(t, []string{subj.InPartition(0), subj.InPartition(1), subj.InBatchPartition(0),
		subj.InBatchPartition(1)}, st.CachedInfo().Config.Subjects)
}
