package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

// batchReceipts is receipts for a holder that sends batches: it also
// reads batched receipts (header Ledger-Batch, a JSON array), counting
// the messages of each kind.
func (e *env) batchReceipts(holder string) (*receiptBook, *[2]int) {
	e.t.Helper()
	b := &receiptBook{byID: map[string][]wire.Receipt{}}
	var msgs [2]int // single, batched
	sub, err := e.nc.Subscribe(e.subj.Receipt(holder), func(m *nats.Msg) {
		var rs []wire.Receipt
		b.mu.Lock()
		defer b.mu.Unlock()
		if m.Header.Get(wire.HeaderBatch) != "" {
			rs, _ = wire.DecodeReceipts(m.Data)
			msgs[1]++
		} else {
			var r wire.Receipt
			if json.Unmarshal(m.Data, &r) == nil {
				rs = append(rs, r)
			}
			msgs[0]++
		}
		for _, r := range rs {
			b.byID[r.EventID] = append(b.byID[r.EventID], r)
			b.all = append(b.all, r)
		}
	})
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(e.t, e.nc.Flush())
	return b, &msgs
}

func (e *env) publishBatch(evs ...event) {
	e.t.Helper()
	in := make([]wire.Inbound, len(evs))
	for i, ev := range evs {
		in[i] = wire.Inbound{ID: ev.id, Partition: ev.partition, Task: ev.task, Holder: ev.holder,
			Generation: ev.generation, Version: ev.version, Type: ev.typ, Payload: []byte(ev.payload)}
	}
	m, err := e.subj.BatchMsg(in)
	require.NoError(e.t, err)
	e.publishMsg(m)
}

// Each event of a batch gets the verdict, log copy and dead letter it
// would get sent alone, its receipts come batched, and the message leaves
// LEDGER_IN once every event in it is durable.
// Switch: TestHooks.NoBatchDecode (the batch is then invalid/bad_subject
// as a whole, and no event commits).
func TestBatchEventsGetTheVerdictsTheyWouldGetAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc, msgs := e.batchReceipts("worker-a.1")
	l := e.acquire(4, "worker-a.1", 60000)
	ev := func(task string, v int64) event {
		return event{id: newID(), partition: 4, task: task, holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	a1, a2, b1 := ev("batch-a", 1), ev("batch-a", 2), ev("batch-b", 1)
	bad := ev("batch-c", 1)
	bad.typ = "no spaces allowed"
	again := a1 // the same event id and content, later in the same batch
	e.publishBatch(a1, a2, bad, b1, again)

	want := map[string]wire.Verdict{a1.id: wire.VerdictCommitted, a2.id: wire.VerdictCommitted,
		b1.id: wire.VerdictCommitted, bad.id: wire.VerdictInvalid}
	for id, v := range want {
		require.Equal(t, v, receiptFor(t, rc, id).Verdict, "event %s", id)
	}
	require.Equal(t, wire.ReasonBadType, receiptFor(t, rc, bad.id).Reason)
	require.Eventually(t, func() bool { rc.mu.Lock(); defer rc.mu.Unlock(); return len(rc.byID[a1.id]) == 2 },
		10*time.Second, 10*time.Millisecond, "the repeated event gets its own receipt")
	rc.mu.Lock()
	require.Equal(t, wire.VerdictDuplicate, rc.byID[a1.id][1].Verdict)
	require.Zero(t, msgs[0], "a batch's receipts come batched")
	rc.mu.Unlock()

	require.Equal(t, []string{"1", "2"}, e.logVersions(4, "batch-a"))
	require.Equal(t, []string{"1"}, e.logVersions(4, "batch-b"))
	letters := e.streamMsgs(wire.StreamDLQ, "")
	require.Len(t, letters, 1)
	require.Equal(t, e.subj.DLQ(4, "batch-c"), letters[0].Subject(), "the dead letter is the event's own")
	require.Equal(t, bad.typ, letters[0].Headers().Get(wire.HeaderType))
	require.Equal(t, bad.payload, string(letters[0].Data()))
	require.Eventually(t, func() bool { return e.streamPending(wire.StreamIn) == 0 }, 10*time.Second,
		10*time.Millisecond, "the batch is acked once every event in it is durable")
	require.Equal(t, 3, e.count(`SELECT count(*) FROM ledger.events`))

	// A conflicting event in a later batch gets its rejection row too.
	other := ev("batch-a", 2)
	other.payload = `{"other":true}`
	b2 := ev("batch-b", 2)
	e.publishBatch(other, b2)
	require.Equal(t, wire.VerdictConflict, receiptFor(t, rc, other.id).Verdict)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, b2.id).Verdict)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM ledger.rejections WHERE event_id = $1`, other.id))
}

// A batch that does not decode is dead-lettered whole, invalid/bad_batch,
// and the events whose ids can be read get that receipt.
// Switch: TestHooks.NoBatchDecode (the reason is then bad_subject, and
// nobody gets a receipt).
func TestBatchThatDoesNotDecodeIsDeadLetteredWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc, _ := e.batchReceipts("worker-a.1")
	id1, id2 := newID(), newID()
	m := nats.NewMsg(e.subj.InBatch("worker-a.1", 2))
	m.Header.Set(wire.HeaderMsgID, "batch-"+id1)
	m.Header.Set(wire.HeaderGeneration, "1")
	m.Header.Set(wire.HeaderBatch, "3") // the body has two
	m.Data = []byte(fmt.Sprintf(`[{"event_id":%q,"task":"t","version":1,"type":"x"},{"event_id":%q}]`, id1, id2))
	e.publishMsg(m)
	for _, id := range []string{id1, id2} {
		r := receiptFor(t, rc, id)
		require.Equal(t, wire.VerdictInvalid, r.Verdict)
		require.Equal(t, wire.ReasonBadBatch, r.Reason)
	}
	var letters []string
	require.Eventually(t, func() bool {
		letters = letters[:0]
		for _, l := range e.streamMsgs(wire.StreamDLQ, "") {
			letters = append(letters, l.Subject()+" "+l.Headers().Get(wire.HeaderReason)+" "+string(l.Data()))
		}
		return len(letters) == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, e.subj.DLQInvalid()+" "+wire.ReasonBadBatch+" "+string(m.Data), letters[0])
	require.Eventually(t, func() bool { return e.streamPending(wire.StreamIn) == 0 }, 10*time.Second, 10*time.Millisecond)
}

// A batch whose element repeats a key, here its event id, could be read
// as either event: the ingest refuses it whole, commits neither, and the
// element's ids get no receipt, since neither is the element's for sure.
// Switch: skip the seen[f] check in pkg/wire's batchScanner.object (the
// first event's verdict is committed). Switch: return id, true at the end
// of wire's exactEventID (the second id gets a bad_batch receipt).
func TestBatchWithARepeatedKeyIsRefusedWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{})
	rc, _ := e.batchReceipts("worker-a.1")
	l := e.acquire(2, "worker-a.1", 60000)
	id1, idA, idB := newID(), newID(), newID()
	m := nats.NewMsg(e.subj.InBatch("worker-a.1", 2))
	m.Header.Set(wire.HeaderMsgID, "batch-"+id1)
	m.Header.Set(wire.HeaderGeneration, fmt.Sprint(l.Generation))
	m.Header.Set(wire.HeaderBatch, "2")
	m.Data = fmt.Appendf(nil, `[{"event_id":%q,"task":"t","version":1,"type":"x"},`+
		`{"event_id":%q,"task":"u","version":1,"type":"x","event_id":%q}]`, id1, idA, idB)
	e.publishMsg(m)
	r := receiptFor(t, rc, id1)
	require.Equal(t, wire.VerdictInvalid, r.Verdict)
	require.Equal(t, wire.ReasonBadBatch, r.Reason)
	require.Eventually(t, func() bool { return e.streamPending(wire.StreamIn) == 0 }, 10*time.Second, 10*time.Millisecond)
	rc.mu.Lock()
	require.Empty(t, rc.byID[idA], "one batched receipt answers the batch")
	require.Empty(t, rc.byID[idB])
	rc.mu.Unlock()
	require.Equal(t, 0, e.count(`SELECT count(*) FROM ledger.events`))
}

// An ingest dies (kill -9) holding a batch with version 1 of a task, its
// events not yet durable. The batch stays in LEDGER_IN, unacked, and the
// next owner of the partition commits it, and versions 2 and 3 sent alone
// after it. (TestEarlierBatchOfThePartitionDelaysTheGap proves the gap check.)
// Switch: TestHooks.BatchAckOnReceive on the first ingest (the batch is
// lost with it: version 1 never commits).
func TestBatchInADeadIngestIsRedeliveredAndDelaysTheGap(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	holding := make(chan struct{}, 1)
	p1cfg := ingest.WithTestHooks(ingest.Config{AckWait: 2 * time.Second, GapWindow: time.Second, StopTimeout: time.Second},
		ingest.TestHooks{BeforeAppend: func(ctx context.Context) {
			select {
			case holding <- struct{}{}:
			default:
			}
			<-ctx.Done() // frozen until the test ends
		}})
	_, p1conn := e.startIngestOn(p1cfg, e.store)
	rc, _ := e.batchReceipts("worker-a.1")
	l := e.acquire(0, "worker-a.1", 120000)
	ev := func(task string, v int64) event {
		return event{id: newID(), partition: 0, task: task, holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	v1, other := ev("crash", 1), ev("other", 1)
	e.publishBatch(other, v1)
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the first ingest never took the batch")
	}
	p1conn.Close() // kill -9: no ack, no nak, no progress from it again

	e.startIngestOn(ingest.Config{AckWait: 2 * time.Second, GapWindow: time.Second}, e.store)
	v2, v3 := ev("crash", 2), ev("crash", 3)
	e.publish(v2)
	e.publish(v3)
	for _, x := range []event{other, v1, v2, v3} {
		r := receiptFor(t, rc, x.id)
		require.Equal(t, wire.VerdictCommitted, r.Verdict, "%s version %d: %+v", x.task, x.version, r)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM ledger.rejections`))
}

// A principal's quota of dead-letter bytes counts each event of a batch
// as if sent alone: each invalid event is a letter of its own, charged
// its own bytes, and the letters past the quota lose their bodies.
// Switch: TestHooks.NoBatchDecode (the batch is one letter, charged once,
// and keeps its body).
func TestBatchedEventsAreChargedTheirOwnDeadLetters(t *testing.T) {
	t.Parallel()
	const quota = 64 << 10
	e := newEnv(t, ingest.Config{DeadLetterQuota: quota})
	payload := `"` + strings.Repeat("x", 16<<10) + `"`
	var evs []event
	for i := range 10 {
		// An invalid type: invalid/bad_type, a dead letter at once.
		evs = append(evs, event{id: newID(), partition: 3, task: fmt.Sprintf("junk-%d", i), holder: "billing.x",
			generation: 1, version: 1, typ: "bad type", payload: payload})
	}
	e.publishBatch(evs...)
	var letters []jetstream.Msg
	require.Eventually(t, func() bool {
		letters = e.streamMsgs(wire.StreamDLQ, "")
		return len(letters) >= len(evs)
	}, 30*time.Second, 50*time.Millisecond)
	require.Len(t, letters, len(evs), "one letter per event")
	whole, cut := 0, 0
	for _, m := range letters {
		dl, err := wire.DecodeDeadLetter(m.Headers(), m.Data())
		require.NoError(t, err)
		require.Equal(t, wire.ReasonBadType, dl.Reason)
		if dl.Truncated >= 0 {
			cut++
			continue
		}
		whole++
		require.Equal(t, payload, string(dl.Data))
	}
	require.Positive(t, whole)
	require.LessOrEqual(t, whole, quota/(16<<10), "the whole letters fit the quota")
	require.Equal(t, len(evs), whole+cut)
}
