package ingest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

// receiptsFor waits until event id has n receipts and returns them.
func receiptsFor(t *testing.T, b *receiptBook, id string, n int) []wire.Receipt {
	t.Helper()
	var rs []wire.Receipt
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		rs = append(rs[:0], b.byID[id]...)
		return len(rs) >= n
	}, 30*time.Second, 5*time.Millisecond, "event %s: fewer than %d receipts", id, n)
	return rs
}

// A re-send under a committed event id with other content, at once and so
// well inside LEDGER_IN's duplicate window, reaches the ledger and is a
// conflict; only an identical re-send is dropped by JetStream.
func TestReSendWithOtherContentInsideTheDuplicateWindowIsAConflict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	l := e.acquire(3, "worker-a.1", 60000)
	ev := event{id: newID(), partition: 3, task: "reuse", holder: "worker-a.1", generation: l.Generation, version: 1,
		typ: "running", payload: `{"n":1}`}
	e.publish(ev)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, ev.id).Verdict)

	ack, err := e.js.PublishMsg(context.Background(), e.msg(ev))
	require.NoError(t, err)
	require.True(t, ack.Duplicate, "an identical re-send is dropped by LEDGER_IN, and its ack says so")

	otherPayload, otherVersion, otherType := ev, ev, ev
	otherPayload.payload = `{"n":2}`
	otherVersion.version = 2
	otherType.typ = "completed"
	for i, re := range []event{otherPayload, otherVersion, otherType} {
		ack, err := e.js.PublishMsg(context.Background(), e.msg(re))
		require.NoError(t, err)
		require.False(t, ack.Duplicate, "re-send %d with other content was dropped by LEDGER_IN", i)
		rs := receiptsFor(t, rc, ev.id, i+2)
		require.Equal(t, wire.VerdictConflict, rs[i+1].Verdict, "re-send %d", i)
		require.Equal(t, wire.ReasonEventIDReused, rs[i+1].Reason, "re-send %d", i)
	}
	require.Equal(t, 1, e.count(`SELECT count(*) FROM ledger.events WHERE task_id = 'reuse'`))
	require.Equal(t, 3, e.count(`SELECT count(*) FROM ledger.rejections WHERE event_id = $1 AND reason = 'event_id_reused'`, ev.id))
}

// An event id has one spelling: a ULID in lower case is refused, so the
// same ULID never commits twice under two spellings.
func TestEventIDInLowerCaseIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	l := e.acquire(4, "worker-a.1", 60000)
	upper := event{id: newID(), partition: 4, task: "spelling", holder: "worker-a.1", generation: l.Generation, version: 1,
		typ: "running", payload: `{}`}
	e.publish(upper)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, upper.id).Verdict)

	lower := upper
	lower.id, lower.version = strings.ToLower(upper.id), 2
	e.publish(lower)
	r := receiptFor(t, rc, lower.id)
	require.Equal(t, wire.VerdictInvalid, r.Verdict)
	require.Equal(t, wire.ReasonBadEventID, r.Reason)

	fresh := lower
	fresh.id = strings.ToLower(newID())
	e.publish(fresh)
	r = receiptFor(t, rc, fresh.id)
	require.Equal(t, wire.VerdictInvalid, r.Verdict)
	require.Equal(t, wire.ReasonBadEventID, r.Reason)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM ledger.events WHERE task_id = 'spelling'`))
}

// A message stored under a subject whose holder is valid but whose task is
// not gets its invalid receipt, not only a dead letter: its publisher is
// told.
func TestMalformedSubjectWithAValidHolderGetsItsReceipt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	m := e.msg(event{id: newID(), partition: 0, task: "x", holder: "worker-a.1", generation: 1, version: 1, typ: "ok"})
	m.Subject = "ledger.in.worker-a.1.0." + strings.Repeat("t", 129)
	e.publishMsg(m)
	id := wire.EventIDOf(m.Header.Get(wire.HeaderMsgID))
	r := receiptFor(t, rc, id)
	require.Equal(t, wire.VerdictInvalid, r.Verdict)
	require.Equal(t, wire.ReasonBadSubject, r.Reason)
	require.Eventually(t, func() bool { return len(e.streamMsgs(wire.StreamDLQ, "ledger.dlq.invalid")) == 1 },
		10*time.Second, 20*time.Millisecond, "the dead letter is stored too")
}
