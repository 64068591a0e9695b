package streams_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// A bucket is asked for by the name it has in NATS, and its definition is
// the one of that very bucket.
func TestBucketIsFoundByItsName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{wire.BucketTasks, wire.BucketProjector, wire.BucketLeases} {
		cfg, err := streams.Bucket(name, streams.Options{Replicas: 3})
		require.NoError(t, err, name)
		require.Equal(t, name, cfg.Bucket)
		require.Equal(t, 3, cfg.Replicas, "the deployment's replica count wins over the file's")
	}
}

// A file stem is not a bucket's name: asking by it is an error, not another
// bucket.
func TestBucketByAnUnknownNameIsAnError(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"tasks", "projector", "", "KV_ledger_tasks"} {
		_, err := streams.Bucket(name, streams.Options{})
		require.Error(t, err, "%q", name)
	}
}

// LEDGER_DLQ is bounded, and a full one keeps taking dead letters by
// dropping its oldest (discard old): an ingest whose dead letter were
// refused would retry it for ever and wedge its lane. The shipped
// definition, with its max_bytes shrunk to 64 KiB to fill it quickly.
func TestFullDeadLetterStreamDropsItsOldestAndTakesTheNewest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := natstest.Start(t).JetStream(t)
	cfg, err := streams.Stream(wire.StreamDLQ, streams.Options{})
	require.NoError(t, err)
	require.Positive(t, cfg.MaxBytes, "LEDGER_DLQ is bounded")
	cfg.MaxBytes = 64 << 10
	_, err = js.CreateStream(ctx, cfg)
	require.NoError(t, err)

	subj := wire.Subjects{Prefix: wire.PrefixDefault}
	body := []byte(strings.Repeat("x", 1024))
	for i := range 200 {
		_, err := js.Publish(ctx, subj.DLQ(1, fmt.Sprintf("task-%d", i)), body)
		require.NoError(t, err, "dead letter %d refused", i)
	}
	st, err := js.Stream(ctx, wire.StreamDLQ)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, info.State.Bytes, uint64(cfg.MaxBytes))
	require.Greater(t, info.State.FirstSeq, uint64(1), "the oldest dead letters were dropped")
	require.Equal(t, uint64(200), info.State.LastSeq, "the newest dead letter is kept")
}

// LEDGER_IN is bounded on its own, and a full one refuses what comes next
// (discard new) rather than drop events that wait for their verdict. The
// shipped definition, with its max_bytes shrunk to 64 KiB to fill it
// quickly.
func TestFullInboxRefusesNewEventsAndKeepsTheWaitingOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := natstest.Start(t).JetStream(t)
	cfg, err := streams.Stream(wire.StreamIn, streams.Options{})
	require.NoError(t, err)
	require.Positive(t, cfg.MaxBytes, "LEDGER_IN is bounded")
	require.Equal(t, jetstream.DiscardNew, cfg.Discard)
	cfg.MaxBytes = 64 << 10
	_, err = js.CreateStream(ctx, cfg)
	require.NoError(t, err)

	subj := wire.Subjects{Prefix: wire.PrefixDefault}
	body := []byte(strings.Repeat("x", 1024))
	var refused int
	for i := range 200 {
		if _, err := js.Publish(ctx, subj.In("flood.a", 1, fmt.Sprintf("task-%d", i)), body); err != nil {
			refused++
		}
	}
	require.Positive(t, refused, "a full inbox refuses new events")
	st, err := js.Stream(ctx, wire.StreamIn)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, info.State.Bytes, uint64(cfg.MaxBytes))
	require.Equal(t, uint64(1), info.State.FirstSeq, "no waiting event was dropped")
}

// Each principal given an inbox of its own has a stream of its own, bounded
// by its share: a full one refuses its principal's next event while
// another principal's inbox still stores. Applied again without the list
// (as every service does at start), the inboxes stay and no LEDGER_IN
// appears beside them; while LEDGER_IN exists, none can be made.
func TestEachPrincipalsInboxHoldsOnlyItsShare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js := natstest.Start(t).JetStream(t)
	require.NoError(t, streams.Apply(ctx, js, streams.Options{Partitions: 4}))
	err := streams.Apply(ctx, js, streams.Options{Partitions: 4, Principals: []string{"billing"}})
	require.ErrorIs(t, err, streams.ErrSharedInboxInUse)
	require.NoError(t, js.DeleteStream(ctx, wire.StreamIn))

	opts := streams.Options{Partitions: 4, Principals: []string{"billing", "reports"}, InboxMaxBytes: 64 << 10}
	require.NoError(t, streams.Apply(ctx, js, opts))
	require.NoError(t, streams.Apply(ctx, js, streams.Options{Partitions: 4}))
	names, err := streams.Inboxes(ctx, js, "")
	require.NoError(t, err)
	require.Equal(t, []string{"LEDGER_IN_billing", "LEDGER_IN_reports"}, names, "no LEDGER_IN beside them")
	st, err := js.Stream(ctx, "LEDGER_IN_billing")
	require.NoError(t, err)
	require.Equal(t, int64(64<<10), st.CachedInfo().Config.MaxBytes, "the share is kept when applied without one")
	require.Contains(t, st.CachedInfo().Config.Subjects, "ledger.in.billing.*.3.*")
	require.Contains(t, st.CachedInfo().Config.Subjects, "ledger.in.billing.*.3")

	subj := wire.Subjects{Prefix: wire.PrefixDefault}
	body := []byte(strings.Repeat("x", 1024))
	var refused error
	for i := 0; i < 200 && refused == nil; i++ {
		_, refused = js.Publish(ctx, subj.In("billing.x", 1, fmt.Sprintf("t-%d", i)), body)
	}
	require.ErrorContains(t, refused, "maximum bytes exceeded", "billing's inbox is full")
	ack, err := js.Publish(ctx, subj.In("reports.a", 1, "report-1"), body)
	require.NoError(t, err, "another principal's inbox still stores")
	require.Equal(t, "LEDGER_IN_reports", ack.Stream)
	_, err = js.Publish(ctx, subj.In("reports.a", 4, "report-1"), body)
	require.Error(t, err, "no inbox stores a partition the deployment lacks")
}
