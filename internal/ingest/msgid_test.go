package ingest_test

import (
	"context"
	"encoding/json"
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

// lookUp asks ledger.task.head for the verdict of event id of task, with
// the content as the publisher sent it (nil: by id alone, as in v2).
func (e *env) lookUp(task, id string, content map[string]any) *wire.EventVerdict {
	e.t.Helper()
	req := map[string]any{"task": task, "event_id": id}
	for k, v := range content {
		req[k] = v
	}
	b, err := json.Marshal(req)
	require.NoError(e.t, err)
	resp, err := e.nc.Request(e.subj.TaskHead(), b, 5*time.Second)
	require.NoError(e.t, err)
	require.Empty(e.t, resp.Header.Get("Nats-Service-Error-Code"), string(resp.Data))
	var r wire.TaskHeadEventReply
	require.NoError(e.t, json.Unmarshal(resp.Data, &r))
	return r.Event
}

// The verdict lookup answers committed only for the content the ledger
// stored under the id: a publisher whose re-send under a committed id
// carried other content learns its conflict, even when its receipt was
// lost.
func TestVerdictLookupAnswersCommittedOnlyForTheContentStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc := e.receipts("worker-a.1")
	l := e.acquire(5, "worker-a.1", 60000)
	ev := event{id: newID(), partition: 5, task: "looked", holder: "worker-a.1", generation: l.Generation, version: 1,
		typ: "running", payload: `{"a":1,"b":[1,2]}`}
	e.publish(ev)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, ev.id).Verdict)

	content := func(version int64, typ, payload string) map[string]any {
		return map[string]any{"version": version, "type": typ, "payload": payload}
	}
	cases := []struct {
		name    string
		content map[string]any
		verdict wire.Verdict
		reason  string
	}{
		{"the content stored", content(1, "running", `{"a":1,"b":[1,2]}`), wire.VerdictCommitted, ""},
		{"the same JSON value written otherwise", content(1, "running", ` {"b":[1,2.0],"a":1}`), wire.VerdictCommitted, ""},
		{"another payload", content(1, "running", `{"a":2,"b":[1,2]}`), wire.VerdictConflict, wire.ReasonEventIDReused},
		{"another version", content(2, "running", `{"a":1,"b":[1,2]}`), wire.VerdictConflict, wire.ReasonEventIDReused},
		{"another type", content(1, "completed", `{"a":1,"b":[1,2]}`), wire.VerdictConflict, wire.ReasonEventIDReused},
		{"an empty body, null", content(1, "running", ""), wire.VerdictConflict, wire.ReasonEventIDReused},
		{"by id alone, as in v2", nil, wire.VerdictCommitted, ""},
	}
	for _, c := range cases {
		got := e.lookUp(ev.task, ev.id, c.content)
		require.NotNil(t, got, c.name)
		require.Equal(t, c.verdict, got.Verdict, c.name)
		require.Equal(t, c.reason, got.Reason, c.name)
	}

	// What a re-send with other content is told by its receipt, the lookup
	// tells it too.
	other := ev
	other.payload = `{"a":2}`
	e.publish(other)
	r := receiptsFor(t, rc, ev.id, 2)[1]
	require.Equal(t, wire.VerdictConflict, r.Verdict)
	got := e.lookUp(ev.task, ev.id, content(1, "running", `{"a":2}`))
	require.Equal(t, r.Verdict, got.Verdict)
	require.Equal(t, r.Reason, got.Reason)
}
