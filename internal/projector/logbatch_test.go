package projector_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// publishBatch puts cs on LEDGER_LOG as log batches of their partition
// (docs/internals/log-batches.md), each message a new one past the
// stream's dedup, and returns the stream sequences of the messages.
func (e *env) publishBatch(cs ...committed) []uint64 {
	e.t.Helper()
	copies := make([]wire.LogCopy, len(cs))
	for i, c := range cs {
		copies[i] = *c.logCopy()
	}
	msgs, err := e.subj.LogBatchMsgs(copies, 1<<20)
	require.NoError(e.t, err)
	var seqs []uint64
	for _, m := range msgs {
		m.Header.Set(wire.HeaderMsgID, ledgertest.NewID())
		ack, err := e.js.PublishMsg(context.Background(), m)
		require.NoError(e.t, err)
		seqs = append(seqs, ack.Sequence)
	}
	return seqs
}

// settled waits until the consumer has every message delivered and acked.
func (e *env) settled(durable string) {
	e.t.Helper()
	cons, err := e.js.Consumer(context.Background(), wire.StreamLog, durable)
	require.NoError(e.t, err)
	require.Eventually(e.t, func() bool {
		info, err := cons.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}, 10*time.Second, 10*time.Millisecond, "every log message of %s acked", durable)
}

// Log batches project as their per-event copies would, beside such copies,
// in any order and again: each task ends as the fold of its versions, and
// every message is acked.
func TestLogBatchesProjectAsTheirCopiesWould(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	e.startWith(projector.Config{}, reg)

	a := e.commit(3, "a", []string{"x", "y", "z"}, []string{`{"a":1}`, `{"b":2}`, `{"a":3}`})
	b := e.commit(3, "b", []string{"x", "y"}, []string{`{"b":1}`, `{"c":null}`})
	c := e.commit(5, "c", []string{"x", "y"}, []string{`{"c":1}`, `{"c":2}`})
	e.publishBatch(a[0], b[0], a[1]) // one batch, two tasks
	e.publishLog(b[1])               // a per-event copy between batches
	e.publishBatch(a[1], a[2])       // a[1] again: a duplicate
	e.publishBatch(c[1])             // c's version 2 before its version 1
	e.publishLog(c[0])

	for task, evs := range map[string][]committed{"a": a, "b": b, "c": c} {
		st := e.waitState(task, 10*time.Second, func(s projection.State) bool { return s.Version == int64(len(evs)) })
		status, data := fold(t, evs)
		require.Equal(t, status, st.Status, task)
		jsonEq(t, data, st.Data, task)
		require.Nil(t, st.Gap, task)
	}
	e.settled("projector")
	// c's version 2 waits for version 1 and is applied with it.
	require.EqualValues(t, 6, metric(t, reg, "ledger_projector_events_total", "outcome", "applied"))
	require.EqualValues(t, 1, metric(t, reg, "ledger_projector_events_total", "outcome", "buffered"))
	require.EqualValues(t, 1, metric(t, reg, "ledger_projector_events_total", "outcome", "duplicate"), "a's version 2, sent twice")
}

// A projector of some partitions gets their batches through its filters
// (ledger.log.<p>.*), and none of the other partitions'.
func TestLogBatchesReachTheProjectorOfTheirPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	low, err := projector.ParsePartitions("0-7", 16)
	require.NoError(t, err)
	high, err := projector.ParsePartitions("8-15", 16)
	require.NoError(t, err)
	e.start(projector.Config{Partitions: low})
	e.start(projector.Config{Partitions: high})
	for p := range 16 {
		var evs []committed
		for k := range 3 {
			evs = append(evs, e.commit(p, fmt.Sprintf("split-%d-%d", p, k), []string{"a", "b"}, []string{`{"x":1}`, `{"y":2}`})...)
		}
		e.publishBatch(evs...)
	}
	for p := range 16 {
		for k := range 3 {
			st := e.waitState(fmt.Sprintf("split-%d-%d", p, k), 10*time.Second, func(s projection.State) bool { return s.Version == 2 })
			require.Equal(t, p, st.Partition)
		}
	}
	for _, durable := range []string{"projector-0-7", "projector-8-15"} {
		e.settled(durable)
		c, err := e.js.Consumer(context.Background(), wire.StreamLog, durable)
		require.NoError(t, err)
		info, err := c.Info(context.Background())
		require.NoError(t, err)
		require.EqualValues(t, 8, info.Delivered.Consumer, "%s saw only its 8 partitions' batches", durable)
	}
}

// A batch that does not decode is terminated whole, loudly, and the log
// flows past it; none of its events is applied.
func TestUndecodableLogBatchIsTerminatedAndTheLogFlows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	logs := e.startLogged()

	bad := e.commit(1, "bad", []string{"x"}, []string{`{"a":1}`})
	good := e.commit(1, "good", []string{"x"}, []string{`{"b":2}`})
	msgs, err := e.subj.LogBatchMsgs([]wire.LogCopy{*bad[0].logCopy(), *good[0].logCopy()}, 1<<20)
	require.NoError(t, err)
	m := msgs[0]
	m.Header.Set(wire.HeaderBatch, "3") // the body holds 2
	_, err = e.js.PublishMsg(ctx, m)
	require.NoError(t, err)
	e.publishBatch(good...)

	st := e.waitState("good", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	jsonEq(t, json.RawMessage(good[0].payload), st.Data, "good")
	_, ok := e.state("bad")
	require.False(t, ok, "no event of an undecodable batch is applied")
	require.Equal(t, 1, logs.count("undecodable message on the committed log; terminated"))
	e.settled("projector")
}

// A batch with an event whose task cannot be loaded comes back whole: its
// other events are duplicates then, and every event is applied once.
func TestLogBatchWithAnUnreadableTaskIsRedeliveredWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	a := e.commit(1, "a", []string{"x", "y"}, []string{`{"a":1}`, `{"a":2}`})
	b := e.commit(1, "b", []string{"x"}, []string{`{"b":1}`})
	reg := prometheus.NewRegistry()
	e.startWith(projector.Config{RetryMax: 200 * time.Millisecond}, reg)
	e.publishBatch(a[0])
	e.waitState("a", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })

	require.NoError(t, e.js.DeleteKeyValue(ctx, wire.BucketTasks))
	e.publishBatch(a[1], b[0]) // a is loaded; b is not, and cannot be read
	waitMetric(t, reg, "ledger_projector_load_failures_total", 1)
	_, err := streams.ApplyBucket(ctx, e.js, wire.BucketTasks, streams.Options{})
	require.NoError(t, err)

	st := e.waitState("b", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	jsonEq(t, json.RawMessage(b[0].payload), st.Data, "b")
	st = e.waitState("a", 10*time.Second, func(s projection.State) bool { return s.Version == 2 })
	_, data := fold(t, a)
	jsonEq(t, data, st.Data, "a")
	e.settled("projector")
	require.EqualValues(t, 3, metric(t, reg, "ledger_projector_events_total", "outcome", "applied"),
		"every event applied exactly once")
	require.GreaterOrEqual(t, metric(t, reg, "ledger_projector_events_total", "outcome", "duplicate"), 1.0,
		"a's version 2 came back with b's event")
}

// A full bucket holds a task of a batch: the batch's other task is
// projected, the batch stays unacked while its task is held, and a
// projector started after this one died projects the held task from it.
func TestLogBatchOfAHeldTaskStaysUnacked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const limit = 48 << 10
	filler := e.commit(1, "filler", []string{"x"}, []string{bigPayload("f", 20_000)})
	big := e.commit(2, "big", []string{"x"}, []string{bigPayload("b", 30_000)})
	small := e.commit(2, "small", []string{"x"}, []string{`{"s":1}`})
	reg := prometheus.NewRegistry()
	p := e.startWith(projector.Config{TasksMaxBytes: limit, RetryMax: 200 * time.Millisecond}, reg)

	e.publishBatch(filler...)
	e.waitState("filler", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	e.publishBatch(big[0], small[0])
	e.waitState("small", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	waitMetric(t, reg, "ledger_projector_held_tasks", 1)
	_, ok := e.state("big")
	require.False(t, ok, "big is held")
	cons, err := e.js.Consumer(context.Background(), wire.StreamLog, "projector")
	require.NoError(t, err)
	info, err := cons.Info(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, info.NumAckPending, "the held task's batch is not acked")

	p.Stop()
	e.start(projector.Config{TasksMaxBytes: -1})
	st := e.waitState("big", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	_, data := fold(t, big)
	jsonEq(t, data, st.Data, "big")
	e.settled("projector")
}

// A backlog of log batches larger than nats.go buffers for a subscription
// (64 MiB) is folded without a message dropped on the client: the pulls are
// bounded in bytes. The ack wait is long, so a dropped message would wait
// out the test. Switch: consume with jetstream.PullMaxMessages(5000), as
// before, and the client drops most of the backlog (slow consumer).
func TestABacklogOfLogBatchesPastTheClientsBufferIsFolded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// 72 messages of about 1 MiB: 16 versions of a task each, every
	// payload 60 KiB.
	const tasks, versions = 72, 16
	blob := strings.Repeat("x", 60<<10)
	types := make([]string, versions)
	payloads := make([]string, versions)
	for v := range versions {
		types[v] = "step"
		payloads[v] = fmt.Sprintf(`{"v":%d,"blob":%q}`, v+1, blob)
	}
	for k := range tasks {
		e.publishBatch(e.commit(k%16, fmt.Sprintf("big-%d", k), types, payloads)...)
	}
	reg := prometheus.NewRegistry()
	e.startWith(projector.Config{AckWait: 10 * time.Minute}, reg)
	for k := range tasks {
		st := e.waitState(fmt.Sprintf("big-%d", k), time.Minute, func(s projection.State) bool { return s.Version == versions })
		require.Contains(t, string(st.Data), fmt.Sprintf(`"v":%d`, versions))
	}
	e.settled("projector")
	require.EqualValues(t, tasks*versions, metric(t, reg, "ledger_projector_events_total", "outcome", "applied"))
}

// A turn counts a log batch as its events: a backlog of batches of one
// task is folded in turns of at most CatchUpBatchSize events, so the task
// is written once per turn. Switch: count each message as one in fill, and
// the whole backlog is one turn with one write.
func TestATurnCountsALogBatchAsItsEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const batches, per = 10, 10
	types := make([]string, per)
	payloads := make([]string, per)
	for v := range per {
		types[v] = "step"
		payloads[v] = fmt.Sprintf(`{"n":%d}`, v)
	}
	for range batches {
		e.publishBatch(e.commit(4, "long", types, payloads)...)
	}
	reg := prometheus.NewRegistry()
	e.startWith(projector.Config{BatchSize: 10, CatchUpBatchSize: 20}, reg)
	e.waitState("long", 10*time.Second, func(s projection.State) bool { return s.Version == batches*per })
	e.settled("projector")
	require.GreaterOrEqual(t, metric(t, reg, "ledger_projector_kv_writes_total"), float64(batches*per/20),
		"100 events in turns of at most 20")
}
