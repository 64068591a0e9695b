package ingest_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

// The seed's takeover story, end to end over NATS.
func TestTakeoverStoryOverNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rcA, rcB := e.receipts("worker.a"), e.receipts("worker.b")

	a := e.acquire(3, "worker.a", 60000)
	a1 := event{id: newID(), partition: 3, task: "report-7", holder: "worker.a", generation: a.Generation, version: 1, typ: "running", payload: `{"step":"running"}`}
	e.publish(a1)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rcA, a1.id).Verdict)

	// A stops renewing and its lease runs out; B takes over.
	e.expire(3)
	b := e.acquire(3, "worker.b", 60000)
	require.Equal(t, a.Generation+1, b.Generation)
	b2 := event{id: newID(), partition: 3, task: "report-7", holder: "worker.b", generation: b.Generation, version: 2, typ: "completed", payload: `{"result":"B"}`}
	e.publish(b2)
	rb := receiptFor(t, rcB, b2.id)
	require.Equal(t, wire.VerdictCommitted, rb.Verdict)

	// A wakes up and writes with its old generation.
	a3 := event{id: newID(), partition: 3, task: "report-7", holder: "worker.a", generation: a.Generation, version: 3, typ: "completed", payload: `{"result":"A"}`}
	e.publish(a3)
	ra := receiptFor(t, rcA, a3.id)
	require.Equal(t, wire.VerdictStale, ra.Verdict)
	require.Equal(t, wire.ReasonSuperseded, ra.Reason)
	require.Equal(t, b.Generation, ra.CurrentGeneration)

	dlq := e.streamMsgs(wire.StreamDLQ, "")
	require.Len(t, dlq, 1)
	h := dlq[0].Headers()
	require.Equal(t, a3.id, wire.EventIDOf(h.Get(wire.HeaderMsgID)))
	require.Equal(t, "stale", h.Get(wire.HeaderVerdict))
	require.Equal(t, "superseded", h.Get(wire.HeaderReason))
	require.Equal(t, fmt.Sprint(b.Generation), h.Get(wire.HeaderCurrentGeneration))
	require.Equal(t, "worker.b", h.Get(wire.HeaderCurrentHolder))
	require.NotEmpty(t, h.Get(wire.HeaderSourceSeq))
	require.NotEmpty(t, h.Get(wire.HeaderRejectedAt))
	require.Equal(t, a3.payload, string(dlq[0].Data()), "the dead letter keeps the original body")
	require.Equal(t, "dlq.3.report-7", strings.TrimPrefix(dlq[0].Subject(), "ledger."))

	require.Equal(t, 1, e.count(`SELECT count(*) FROM ledger.rejections WHERE event_id = $1 AND verdict = 'stale' AND reason = 'superseded'`, a3.id))
	require.Equal(t, 0, e.count(`SELECT count(*) FROM ledger.events e JOIN ledger.lease_grants g
		ON g.partition = e.partition AND g.generation = $1 WHERE e.generation < $1 AND e.committed_at >= g.granted_at`, b.Generation),
		"the committed log holds no event of A's after B's grant")

	log := e.streamMsgs(wire.StreamLog, "")
	require.Len(t, log, 2)
	require.Equal(t, b2.id, log[1].Headers().Get(wire.HeaderMsgID))
	require.Equal(t, "worker.b", log[1].Headers().Get(wire.HeaderHolder))
	require.Equal(t, fmt.Sprint(rb.Seq), log[1].Headers().Get(wire.HeaderSeq))
	require.Equal(t, "2", log[1].Headers().Get(wire.HeaderVersion))
	require.Equal(t, "report-7", log[1].Headers().Get(wire.HeaderTask))
	require.Equal(t, "3", log[1].Headers().Get(wire.HeaderPartition))
	require.NotEmpty(t, log[1].Headers().Get(wire.HeaderCommittedAt))
}

func TestOutOfOrderVersionIsCommittedAfterItsPredecessor(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	l := e.acquire(1, "worker-a.1", 60000)
	v2 := event{id: newID(), partition: 1, task: "report-9", holder: "worker-a.1", generation: l.Generation, version: 2, typ: "completed", payload: `{"v":2}`}
	v1 := event{id: newID(), partition: 1, task: "report-9", holder: "worker-a.1", generation: l.Generation, version: 1, typ: "running", payload: `{"v":1}`}
	e.publish(v2)
	// v2 waits: no verdict yet, nothing committed.
	require.Never(t, func() bool { return e.count(`SELECT count(*) FROM ledger.events`) > 0 }, 150*time.Millisecond, 20*time.Millisecond)
	e.publish(v1)
	r1, r2 := receiptFor(t, rc, v1.id), receiptFor(t, rc, v2.id)
	require.Equal(t, wire.VerdictCommitted, r1.Verdict)
	require.Equal(t, wire.VerdictCommitted, r2.Verdict)
	require.Less(t, r1.Seq, r2.Seq, "committed in version order")

	log := e.streamMsgs(wire.StreamLog, "")
	require.Len(t, log, 2)
	require.Equal(t, "1", log[0].Headers().Get(wire.HeaderVersion))
	require.Equal(t, "2", log[1].Headers().Get(wire.HeaderVersion))
	// v2 was redelivered after a delay, never rejected.
	require.Empty(t, e.streamMsgs(wire.StreamDLQ, ""))
}

func TestDuplicatesAreAckedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	l := e.acquire(2, "worker-a.1", 60000)
	v1 := event{id: newID(), partition: 2, task: "t", holder: "worker-a.1", generation: l.Generation, version: 1, typ: "running", payload: `{"a":1}`}

	// Same Nats-Msg-Id twice: JetStream's dedup window swallows the second.
	ack1, err := e.js.PublishMsg(context.Background(), e.msg(v1))
	require.NoError(t, err)
	ack2, err := e.js.PublishMsg(context.Background(), e.msg(v1))
	require.NoError(t, err)
	require.True(t, ack2.Duplicate)
	require.Equal(t, ack1.Sequence, ack2.Sequence)
	r1 := receiptFor(t, rc, v1.id)
	require.Equal(t, wire.VerdictCommitted, r1.Verdict)

	// Same content under a new id: the duplicate verdict, same seq.
	again := v1
	again.id = newID()
	e.publish(again)
	r2 := receiptFor(t, rc, again.id)
	require.Equal(t, wire.VerdictDuplicate, r2.Verdict)
	require.Equal(t, wire.ReasonSameContent, r2.Reason)
	require.Equal(t, r1.Seq, r2.Seq)

	require.Equal(t, 1, e.count(`SELECT count(*) FROM ledger.events`))
	require.Eventually(t, func() bool { return e.streamPending(wire.StreamIn) == 0 }, 5*time.Second, 20*time.Millisecond,
		"every inbound message is acked")
	require.Len(t, e.streamMsgs(wire.StreamLog, ""), 1, "the log keeps one copy (dedup by event id)")
	require.Empty(t, e.streamMsgs(wire.StreamDLQ, ""))
}

func TestConflictAndGapAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{GapWindow: 300 * time.Millisecond})
	rc := e.receipts("worker-a.1")
	l := e.acquire(4, "worker-a.1", 60000)
	v1 := event{id: newID(), partition: 4, task: "t", holder: "worker-a.1", generation: l.Generation, version: 1, typ: "running", payload: `{"a":1}`}
	e.publish(v1)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, v1.id).Verdict)

	other := v1
	other.id, other.payload = newID(), `{"a":2}`
	e.publish(other)
	rconf := receiptFor(t, rc, other.id)
	require.Equal(t, wire.VerdictConflict, rconf.Verdict)
	require.Equal(t, wire.ReasonVersionTaken, rconf.Reason)

	ahead := event{id: newID(), partition: 4, task: "t", holder: "worker-a.1", generation: l.Generation, version: 5, typ: "x", payload: `{}`}
	start := time.Now()
	e.publish(ahead)
	rgap := receiptFor(t, rc, ahead.id)
	require.Equal(t, wire.VerdictGap, rgap.Verdict)
	require.Equal(t, wire.ReasonGapTimeout, rgap.Reason)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "the gap verdict waited for the window")

	reasons := map[string]string{}
	for _, m := range e.streamMsgs(wire.StreamDLQ, "") {
		reasons[wire.EventIDOf(m.Headers().Get(wire.HeaderMsgID))] = m.Headers().Get(wire.HeaderVerdict) + "/" + m.Headers().Get(wire.HeaderReason)
	}
	require.Equal(t, map[string]string{other.id: "conflict/version_taken", ahead.id: "gap/gap_timeout"}, reasons)
	require.Equal(t, 2, e.count(`SELECT count(*) FROM ledger.rejections`))
}

func TestMalformedMessagesAreDeadLetteredAndIngestKeepsCommitting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	l := e.acquire(0, "worker-a.1", 60000)
	good := func(task string, v int64) event {
		return event{id: newID(), partition: 0, task: task, holder: "worker-a.1", generation: l.Generation, version: v, typ: "ok", payload: `{"ok":true}`}
	}
	// Pin task "pinned" to partition 0 first.
	first := good("pinned", 1)
	e.publish(first)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, first.id).Verdict)

	mutate := func(f func(m *nats.Msg)) *nats.Msg {
		m := e.msg(good("bad", 1))
		f(m)
		return m
	}
	cases := []struct {
		name   string
		msg    *nats.Msg
		reason string
	}{
		{"no event id", mutate(func(m *nats.Msg) { m.Header.Del(wire.HeaderMsgID) }), wire.ReasonMissingEventID},
		{"another holder in the header", mutate(func(m *nats.Msg) { m.Header.Set(wire.HeaderHolder, "worker-b.1") }), wire.ReasonHolderMismatch},
		{"no generation", mutate(func(m *nats.Msg) { m.Header.Del(wire.HeaderGeneration) }), wire.ReasonMissingGen},
		{"no version", mutate(func(m *nats.Msg) { m.Header.Del(wire.HeaderVersion) }), wire.ReasonMissingVersion},
		{"no type", mutate(func(m *nats.Msg) { m.Header.Del(wire.HeaderType) }), wire.ReasonMissingType},
		{"generation not a number", mutate(func(m *nats.Msg) { m.Header.Set(wire.HeaderGeneration, "forty") }), wire.ReasonBadGeneration},
		{"negative version", mutate(func(m *nats.Msg) { m.Header.Set(wire.HeaderVersion, "-1") }), wire.ReasonBadVersion},
		{"version zero", mutate(func(m *nats.Msg) { m.Header.Set(wire.HeaderVersion, "0") }), wire.ReasonBadVersion},
		{"version with sign", mutate(func(m *nats.Msg) { m.Header.Set(wire.HeaderVersion, "+2") }), wire.ReasonBadVersion},
		{"bad ULID", mutate(func(m *nats.Msg) { m.Header.Set(wire.HeaderMsgID, "not-a-ulid-at-all") }), wire.ReasonBadEventID},
		{"bad type", mutate(func(m *nats.Msg) { m.Header.Set(wire.HeaderType, "has space") }), wire.ReasonBadType},
		{"repeated header", mutate(func(m *nats.Msg) { m.Header.Add(wire.HeaderVersion, "2") }), wire.ReasonRepeatedHeader},
		{"non-JSON body", mutate(func(m *nats.Msg) { m.Data = []byte("{not json") }), wire.ReasonBadPayload},
		{"oversized body", mutate(func(m *nats.Msg) { m.Data = []byte(`"` + strings.Repeat("x", wire.MaxPayloadDefault) + `"`) }), wire.ReasonPayloadTooLarge},
		{"task id too long", mutate(func(m *nats.Msg) { m.Subject = "ledger.in.worker-a.1.0." + strings.Repeat("t", 129) }), wire.ReasonBadSubject},
		{"wrong partition for a pinned task", func() *nats.Msg {
			ev := good("pinned", 2)
			ev.partition = 1
			return e.msg(ev)
		}(), wire.ReasonWrongPartition},
	}
	// LEDGER_IN stores only the subjects of the deployment's partitions:
	// a publish to any other is refused at once, so nothing sits in the
	// stream without a consumer to judge it. (ledger.in.worker-a.1.0 is
	// partition 0's batch subject: batch_test.go.)
	for _, subject := range []string{"ledger.in.worker-a.1.99", "ledger.in.worker-a.1.x.bad", "ledger.in.worker-a.0.bad",
		"ledger.in.worker-a.1.99.bad", "ledger.in.worker-a.1.01.bad", "ledger.in.worker-a.1.0.bad.more"} {
		m := mutate(func(m *nats.Msg) { m.Subject = subject })
		_, err := e.js.PublishMsg(context.Background(), m)
		require.ErrorIs(t, err, jetstream.ErrNoStreamResponse, subject)
	}
	seqs := make([]uint64, len(cases))
	for i, c := range cases {
		ack, err := e.js.PublishMsg(context.Background(), c.msg)
		require.NoError(t, err, c.name)
		seqs[i] = ack.Sequence
	}
	// Good events published after the bad ones are still committed.
	after := good("after", 1)
	e.publish(after)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, after.id).Verdict)

	require.Eventually(t, func() bool { return len(e.streamMsgs(wire.StreamDLQ, "")) >= len(cases) }, 10*time.Second, 50*time.Millisecond)
	dlq := e.streamMsgs(wire.StreamDLQ, "")
	require.Len(t, dlq, len(cases), "one dead letter per bad message")
	bySource := map[string]jetstream.Msg{}
	for _, m := range dlq {
		bySource[m.Headers().Get(wire.HeaderSourceSeq)] = m
	}
	for i, c := range cases {
		m, ok := bySource[fmt.Sprint(seqs[i])]
		require.True(t, ok, "%s: no dead letter", c.name)
		require.Equal(t, "invalid", m.Headers().Get(wire.HeaderVerdict), c.name)
		require.Equal(t, c.reason, m.Headers().Get(wire.HeaderReason), c.name)
		if c.reason == wire.ReasonBadSubject {
			require.Equal(t, "ledger.dlq.invalid", m.Subject(), "%s: an unusable subject goes to dlq.invalid", c.name)
		}
	}
	require.Equal(t, 2, e.count(`SELECT count(*) FROM ledger.events`))
}

func TestCrashAfterCommitBeforeAckLosesNothingAndWritesNothingTwice(t *testing.T) {
	t.Parallel()
	var crashed atomic.Bool
	cfg := ingest.Config{AckWait: time.Second}
	e := newEnv(t, ingest.WithCrashAfterPublish(cfg, func() bool {
		crashed.Store(true) // from here on this process acks nothing: it is dead
		return false
	}))
	l := e.acquire(5, "worker-a.1", 60000)
	var ids []string
	for v := int64(1); v <= 20; v++ {
		ev := event{id: newID(), partition: 5, task: "crash", holder: "worker-a.1", generation: l.Generation, version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
		ids = append(ids, ev.id)
		e.publish(ev)
	}
	require.Eventually(t, crashed.Load, 10*time.Second, 10*time.Millisecond)
	committedBeforeCrash := e.count(`SELECT count(*) FROM ledger.events`)
	require.Positive(t, committedBeforeCrash, "the crashed batch had committed in Postgres")
	e.svc.Stop() // the crashed process is gone; its batch was never acked

	rc := e.receipts("worker-a.1")
	e.startIngest(cfg) // a restarted process redelivers the unacked messages
	for _, id := range ids {
		r := receiptFor(t, rc, id)
		require.Contains(t, []wire.Verdict{wire.VerdictCommitted, wire.VerdictDuplicate}, r.Verdict)
	}
	require.Equal(t, 20, e.count(`SELECT count(*) FROM ledger.events`), "none lost, none twice")
	require.Equal(t, 20, e.count(`SELECT count(DISTINCT version) FROM ledger.events WHERE task_id = 'crash'`))
	logIDs := map[string]bool{}
	for _, m := range e.streamMsgs(wire.StreamLog, "") {
		logIDs[m.Headers().Get(wire.HeaderMsgID)] = true
	}
	for _, id := range ids {
		require.True(t, logIDs[id], "committed event %s is in LEDGER_LOG", id)
	}
	require.Len(t, logIDs, 20)
}

// A batch holding a task's version 2 before its version 1 commits both, and
// their log copies follow commit order, not arrival order.
func TestLogCopiesFollowCommitOrderWithinABatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{BatchWait: 200 * time.Millisecond}) // both land in one batch
	rc := e.receipts("worker-a.1")
	l := e.acquire(8, "worker-a.1", 60000)
	v2 := event{id: newID(), partition: 8, task: "ordered", holder: "worker-a.1", generation: l.Generation, version: 2, typ: "completed", payload: `{"v":2}`}
	v1 := event{id: newID(), partition: 8, task: "ordered", holder: "worker-a.1", generation: l.Generation, version: 1, typ: "running", payload: `{"v":1}`}
	e.msgAsync(v2)
	e.msgAsync(v1)
	e.waitAsync()
	r1, r2 := receiptFor(t, rc, v1.id), receiptFor(t, rc, v2.id)
	require.Equal(t, wire.VerdictCommitted, r1.Verdict)
	require.Equal(t, wire.VerdictCommitted, r2.Verdict)
	log := e.streamMsgs(wire.StreamLog, "")
	require.Len(t, log, 2)
	require.Equal(t, "1", log[0].Headers().Get(wire.HeaderVersion), "version 1's copy comes first")
	require.Equal(t, "2", log[1].Headers().Get(wire.HeaderVersion))
}

// A publisher that set its own publish expectations (Nats-Expected-Stream)
// still gets its dead letter: the copy does not inherit them.
func TestDeadLetterDoesNotInheritPublishExpectations(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	ev := event{id: newID(), partition: 2, task: "t", holder: "worker-a.1", generation: 1, version: 1, typ: "x", payload: `{}`}
	_, err := e.js.PublishMsg(context.Background(), e.msg(ev), jetstream.WithExpectStream(wire.StreamIn))
	require.NoError(t, err)
	r := receiptFor(t, rc, ev.id)
	require.Equal(t, wire.VerdictStale, r.Verdict)
	require.Equal(t, wire.ReasonNoLease, r.Reason)
	dlq := e.streamMsgs(wire.StreamDLQ, "")
	require.Len(t, dlq, 1)
	require.Empty(t, dlq[0].Headers().Get("Nats-Expected-Stream"))
}
