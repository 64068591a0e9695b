package ctl_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/wire"
)

// publishLogBatch puts a log batch of partition p on LEDGER_LOG: version 1
// of each task, in order.
func publishLogBatch(t *testing.T, ns *natstest.Server, p int, tasks ...string) {
	t.Helper()
	var copies []wire.LogCopy
	for i, task := range tasks {
		copies = append(copies, wire.LogCopy{Seq: int64(100 + i), EventID: fmt.Sprintf("01JD%022d", i), Partition: p, Task: task,
			Version: 1, Type: "step", Holder: "worker-a.1", Generation: 1, CommittedAt: time.Now(),
			Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
	}
	msgs, err := wire.Subjects{}.LogBatchMsgs(copies, 1<<20)
	require.NoError(t, err)
	for _, m := range msgs {
		_, err := ns.JetStream(t).PublishMsg(context.Background(), m)
		require.NoError(t, err)
	}
}

// tail prints a log batch's events one by one, as it prints copies; with
// -task, only that task's, from batches and copies alike; -n counts events.
func TestTailPrintsTheEventsOfLogBatches(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	run(t, "-nats-url", ns.URL(), "streams", "apply").ok(t)
	publishLogBatch(t, ns, 7, "a", "b", "c")
	publishLogBatch(t, ns, 8, "b", "d")

	lines := run(t, "-nats-url", ns.URL(), "tail", "-n", "5", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 5)
	var got []string
	for _, l := range lines {
		got = append(got, fmt.Sprintf("%v/%v", l["partition"], l["task"]))
	}
	assert.Equal(t, []string{"7/a", "7/b", "7/c", "8/b", "8/d"}, got)
	assert.Equal(t, map[string]any{"i": float64(1)}, lines[1]["payload"])

	lines = run(t, "-nats-url", ns.URL(), "tail", "-n", "2", "-task", "b", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 2)
	assert.Equal(t, []any{float64(7), float64(8)}, []any{lines[0]["partition"], lines[1]["partition"]})
	for _, l := range lines {
		assert.Equal(t, "b", l["task"])
	}
	lines = run(t, "-nats-url", ns.URL(), "tail", "-n", "1", "-task", "d", "-partition", "8", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, "d", lines[0]["task"])
	lines = run(t, "-nats-url", ns.URL(), "tail", "-n", "2", "-partition", "8", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 2)
}

// verify counts a task's copies in log batches: tasks whose per-event
// copies are gone are missing their copies until a batch holds them.
func TestVerifyCountsCopiesInLogBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withIngest(ingest.Config{})
	ctx := context.Background()
	l := e.acquire(2, "worker-a.1")
	for _, ev := range []event{{task: "t-0", version: 1}, {task: "t-0", version: 2}, {task: "t-1", version: 1}} {
		ev.partition, ev.holder, ev.generation, ev.typ = 2, l.Holder, l.Generation, "step"
		e.publish(ev)
	}
	require.Eventually(t, func() bool { return len(e.logVersions(2, "t-0")) == 2 && len(e.logVersions(2, "t-1")) == 1 },
		10*time.Second, 10*time.Millisecond)
	s, err := e.js.Stream(ctx, wire.StreamLog)
	require.NoError(t, err)
	for _, task := range []string{"t-0", "t-1"} {
		require.NoError(t, s.Purge(ctx, jetstream.WithPurgeSubject(e.subj.Log(2, task))))
	}
	v := e.run("verify", "-grace", "0", "-kinds", "log", "-json")
	require.Equal(t, 1, v.code, v.stderr)
	require.ElementsMatch(t, []string{"t-0", "t-1"}, findings(t, v)["log"])

	publishLogBatch(t, e.ns, 2, "t-0", "t-1") // version 1 of each
	v = e.run("verify", "-grace", "0", "-kinds", "log", "-json")
	require.Equal(t, 1, v.code, v.stderr)
	require.Equal(t, []string{"t-0"}, findings(t, v)["log"], "t-0's version 2 is in no batch")

	batch := wire.LogCopy{Seq: 200, EventID: "01JD0000000000000000000200", Partition: 2, Task: "t-0", Version: 2, Type: "step",
		Holder: l.Holder, Generation: l.Generation, CommittedAt: time.Now()}
	msgs, err := e.subj.LogBatchMsgs([]wire.LogCopy{batch}, 1<<20)
	require.NoError(t, err)
	_, err = e.js.PublishMsg(ctx, msgs[0])
	require.NoError(t, err)
	e.run("verify", "-grace", "0", "-kinds", "log").ok(t)
}

// restore finds a forgotten commit's copy in a log batch as in a copy of
// its own.
func TestRestoreWritesBackFromALogBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	first, err := ingest.New(ingest.Config{}, ingest.Deps{NC: e.ns.Conn(t), Store: e.store, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, first.Start(ctx))
	l := e.acquire(1, "worker-a.1")
	for v := int64(1); v <= 3; v++ {
		e.publish(event{partition: 1, task: "t", holder: l.Holder, generation: l.Generation, version: v, typ: "step", payload: `{"v":1}`})
	}
	e.waitCommitted("t", 3)
	e.waitMsgs(wire.StreamLog, 3)
	first.Stop()

	// The task's copies become one log batch.
	s, err := e.js.Stream(ctx, wire.StreamLog)
	require.NoError(t, err)
	var copies []wire.LogCopy
	for seq := uint64(1); seq <= 3; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		c, err := e.subj.DecodeLog(m.Subject, m.Header, m.Data)
		require.NoError(t, err)
		copies = append(copies, c)
	}
	require.NoError(t, s.Purge(ctx, jetstream.WithPurgeSubject(e.subj.Log(1, "t"))))
	msgs, err := e.subj.LogBatchMsgs(copies, 1<<20)
	require.NoError(t, err)
	_, err = e.js.PublishMsg(ctx, msgs[0])
	require.NoError(t, err)

	e.forget("t", 3)
	out := e.run("restore", "-json").ok(t).jsonLines(t)
	require.Len(t, out, 1)
	require.Equal(t, copies[2].EventID, out[0]["event_id"])
	require.Equal(t, "restored", out[0]["outcome"])
	require.Equal(t, 3, e.count(`SELECT count(*) FROM ledger.events WHERE task_id = 't'`))
}
