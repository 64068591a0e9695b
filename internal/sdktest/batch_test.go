package sdktest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// inStored is how many messages LEDGER_IN has stored so far (its last
// sequence: a work queue deletes what was acked).
func (l *ledger) inStored(ctx context.Context) uint64 {
	l.t.Helper()
	st, err := l.ns.JetStream(l.t).Stream(ctx, wire.StreamIn)
	require.NoError(l.t, err)
	info, err := st.Info(ctx)
	require.NoError(l.t, err)
	return info.State.LastSeq
}

// publishMany publishes n events over tasks, round robin, and returns them.
func publishMany(ctx context.Context, t *testing.T, lease *worker.Lease, tasks []string, n int) []*worker.Pending {
	t.Helper()
	ps := make([]*worker.Pending, 0, n)
	for i := range n {
		p, err := lease.Publish(ctx, tasks[i%len(tasks)], "step", fmt.Appendf(nil, `{"i":%d}`, i))
		require.NoError(t, err)
		ps = append(ps, p)
	}
	return ps
}

// A lease's events published together leave in a few batch messages, and
// each gets its own verdict: every one is committed, in version order per
// task.
// Switch: Config.BatchMax 1 (one LEDGER_IN message per event).
func TestEventsOfALeaseLeaveInBatchesAndEachIsCommitted(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	c := l.client(nil, worker.Config{Holder: "batch.a", BatchLinger: 20 * time.Millisecond})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	tasks := []string{"b-1", "b-2", "b-3"}
	// Learn the heads first, so the events leave as they are published.
	for _, task := range tasks {
		p, err := lease.Publish(ctx, task, "start", nil)
		require.NoError(t, err)
		require.NoError(t, p.Wait(ctx))
	}
	before := l.inStored(ctx)
	const n = 300
	for _, p := range publishMany(ctx, t, lease, tasks, n) {
		require.NoError(t, p.Wait(ctx))
	}
	messages := l.inStored(ctx) - before
	require.Less(t, messages, uint64(n/10), "%d events took %d LEDGER_IN messages", n, messages)
	for _, task := range tasks {
		rows := l.events(task)
		require.Len(t, rows, 1+n/len(tasks))
		for i, r := range rows {
			require.Equal(t, int64(i+1), r.Version)
		}
	}
}

// An event with no other in its linger goes as a batch of one, so a task's
// versions keep to one form and one of the ingest's two consumers of the
// partition: a later version never waits for an earlier one the other
// holds. Only an event larger than BatchMaxBytes goes alone.
// Switch: flushLocked sending a lone event as a single message (the rule
// before): the first message is a single event's.
func TestALoneEventGoesAsABatchOfOne(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	subjects := make(chan string, 16)
	sub, err := l.ns.Conn(t).Subscribe(wire.Subjects{}.InAll(), func(m *nats.Msg) { subjects <- m.Subject })
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	c := l.client(nil, worker.Config{Holder: "batch.c", BatchMaxBytes: 4 << 10})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)

	p, err := lease.Publish(ctx, "lone", "start", []byte(`{"n":1}`))
	require.NoError(t, err)
	require.NoError(t, p.Wait(ctx))
	require.True(t, wire.Subjects{}.IsInBatch(<-subjects), "a lone event goes as a batch of one")

	big := []byte(`{"blob":"` + strings.Repeat("x", 8<<10) + `"}`)
	p, err = lease.Publish(ctx, "lone", "step", big)
	require.NoError(t, err)
	require.NoError(t, p.Wait(ctx))
	require.Equal(t, wire.Subjects{}.In("batch.c", 1, "lone"), <-subjects, "one larger than BatchMaxBytes goes alone")
	require.Len(t, l.events("lone"), 2)
}

// Against a ledger whose LEDGER_IN has no batch subjects (one older than
// batches), the batch publish fails at once and its events are sent again
// alone: every event is committed.
// Switch: batchFailed not sending the events again (they never get a
// verdict).
func TestClientFallsBackToSingleEventsWhenTheInboxTakesNoBatches(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	js := l.ns.JetStream(t)
	st, err := js.Stream(ctx, wire.StreamIn)
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	subj := wire.Subjects{}
	var old []string
	for _, s := range cfg.Subjects {
		if !subj.IsInBatch(s) {
			old = append(old, s)
		}
	}
	require.Less(t, len(old), len(cfg.Subjects))
	cfg.Subjects = old
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)

	c := l.client(nil, worker.Config{Holder: "batch.b", BatchLinger: 20 * time.Millisecond})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	p, err := lease.Publish(ctx, "old", "start", nil)
	require.NoError(t, err)
	require.NoError(t, p.Wait(ctx))
	const n = 50
	for _, p := range publishMany(ctx, t, lease, []string{"old"}, n) {
		require.NoError(t, p.Wait(ctx))
	}
	require.Len(t, l.events("old"), 1+n)
	require.Equal(t, uint64(1+n), l.inStored(ctx), "one message per event, none of them a batch")
}

// A batch message lost from LEDGER_IN after its publish ack (a stream that
// lost an acknowledged write) is recovered event by event: each event's
// lookup finds no record, and each is published again alone and committed.
// Switch: lookUpVerdict not calling publishAgain (the events wait for ever).
func TestLostBatchIsRecoveredEventByEvent(t *testing.T) {
	t.Parallel()
	l, startIngest := newStoppableLedger(t)
	first := startIngest()
	ctx := testCtx(t, 60*time.Second)
	c := l.client(nil, worker.Config{Holder: "lost.batch", TTL: 60 * time.Second, ReceiptTimeout: receiptTimeout,
		BatchLinger: 50 * time.Millisecond})
	lease, err := c.Acquire(ctx, 2)
	require.NoError(t, err)
	p0, err := lease.Publish(ctx, "report", "start", nil)
	require.NoError(t, err)
	require.NoError(t, p0.Wait(ctx))

	first.Stop()
	ps := publishMany(ctx, t, lease, []string{"report"}, 3)
	var acks []*jetstream.PubAck
	for _, p := range ps {
		ack, err := p.PubAck(ctx)
		require.NoError(t, err)
		acks = append(acks, ack)
	}
	require.Equal(t, acks[0].Sequence, acks[2].Sequence, "the three events left in one message")
	l.loseInMsg(ctx, acks[0].Sequence)
	startIngest()
	for _, p := range ps {
		require.NoError(t, p.Wait(testCtx(t, settleWait)), "a lost event was not committed")
	}
	require.Len(t, l.events("report"), 4)
}
