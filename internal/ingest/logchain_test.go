package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

// loggedCopy is one copy in LEDGER_LOG, per-event or in a batch.
type loggedCopy struct {
	wire.LogCopy
	streamSeq uint64
	batched   bool
}

// logged reads every copy LEDGER_LOG holds, in stream order, and the
// number of messages they are in.
func (e *env) logged() ([]loggedCopy, int) {
	e.t.Helper()
	msgs := e.streamMsgs(wire.StreamLog, "")
	var out []loggedCopy
	for _, m := range msgs {
		copies, err := e.subj.DecodeLogCopies(m.Subject(), m.Headers(), m.Data())
		if bytes.HasPrefix(m.Data(), forged) {
			continue // a test's own junk (TestAForgedLastLinkDoesNotWedgeTheLane)
		}
		require.NoError(e.t, err, "message on %s", m.Subject())
		meta, err := m.Metadata()
		require.NoError(e.t, err)
		for _, c := range copies {
			out = append(out, loggedCopy{LogCopy: c, streamSeq: meta.Sequence.Stream, batched: e.subj.IsLogBatch(m.Subject())})
		}
	}
	return out, len(msgs)
}

// checkLogOrder fails unless LEDGER_LOG holds every version of each task
// in want (task → its highest version) in order: each copy is the task's
// next version or a repeat of one before it.
func checkLogOrder(t *testing.T, copies []loggedCopy, want map[string]int64) {
	t.Helper()
	top := map[string]int64{}
	for _, c := range copies {
		switch last := top[c.Task]; {
		case c.Version <= last:
		case c.Version == last+1:
			top[c.Task] = c.Version
		default:
			t.Fatalf("task %s: version %d at stream seq %d before version %d", c.Task, c.Version, c.streamSeq, last+1)
		}
	}
	for task, v := range want {
		require.Equal(t, v, top[task], "task %s's last version in LEDGER_LOG", task)
	}
}

// logBatchesConfig is an ingest writing log batches.
func logBatchesConfig() ingest.Config {
	return ingest.Config{AckWait: 5 * time.Second, StopTimeout: time.Second, LogBatches: true}
}

// With log batches on, LEDGER_LOG holds every commit, in each task's
// version order, in far fewer messages than events: one per partition of
// a batch. Switch: LogBatches off; the log holds one message per event.
func TestLogBatchesHoldEveryCommitInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, logBatchesConfig())
	rc := e.receipts("worker-a.1")
	gens := map[int]int64{}
	for p := range 4 {
		gens[p] = e.acquire(p, "worker-a.1", 120000).Generation
	}
	const tasks, versions = 40, 5
	want := map[string]int64{}
	var last event
	for v := int64(1); v <= versions; v++ {
		for k := range tasks {
			p := k % 4
			last = event{id: newID(), partition: p, task: fmt.Sprintf("t-%d", k), holder: "worker-a.1",
				generation: gens[p], version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
			e.msgAsync(last)
			want[last.task] = v
		}
	}
	e.waitAsync()
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, last.id).Verdict)
	require.Eventually(t, func() bool { return rc.count() >= tasks*versions }, 30*time.Second, 10*time.Millisecond)
	copies, msgs := e.logged()
	checkLogOrder(t, copies, want)
	require.Len(t, copies, tasks*versions, "each commit once")
	for _, c := range copies {
		require.True(t, c.batched, "copy of %s v%d is in a batch", c.Task, c.Version)
	}
	require.Less(t, msgs, tasks*versions/4, "messages in LEDGER_LOG for %d events", tasks*versions)
}

// diedBeforeLinks starts an ingest writing log batches, has it commit
// versions 1..n of each task on partition 8 for worker-a.1, storing the
// links of the first stored of them only, and closes its connection: the
// later commits are in PostgreSQL, their links nowhere. It returns
// worker-a.1's receipts and a maker of events of worker-a.1's lease.
func (e *env) diedBeforeLinks(tasks []string, n, stored int64) (*receiptBook, func(task string, v int64) event) {
	e.t.Helper()
	var drop atomic.Bool
	cfg := ingest.WithTestHooks(logBatchesConfig(), ingest.TestHooks{DropCopy: func(*nats.Msg) bool { return drop.Load() }})
	_, conn := e.startIngestOn(cfg, e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(8, "worker-a.1", 120000)
	ev := func(task string, v int64) event {
		return event{id: newID(), partition: 8, task: task, holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	for v := int64(1); v <= n; v++ {
		drop.Store(v > stored)
		for _, task := range tasks {
			x := ev(task, v)
			e.publish(x)
			if v <= stored {
				require.Equal(e.t, wire.VerdictCommitted, receiptFor(e.t, rc, x.id).Verdict)
			}
		}
	}
	want := len(tasks) * int(n)
	require.Eventually(e.t, func() bool { return e.count(`SELECT count(*) FROM ledger.events`) == want },
		10*time.Second, 10*time.Millisecond)
	conn.Close() // dies with its last commits in PostgreSQL and no link of them stored
	return rc, ev
}

// An ingest dies after committing, before storing the links. The ingest
// that takes the partition over stores the dead one's commits of the
// partition before its own, in order, though no task of its own batch
// needs them; the tail check is off, so the chain alone does it. Switch:
// planLinks without its read of the rows above the chain's top; LEDGER_LOG
// then lacks version 2.
func TestATakeoverStoresTheDeadIngestsCommitsBeforeItsOwnLinks(t *testing.T) {
	t.Parallel()
	for _, stored := range []int64{0, 1} {
		t.Run(fmt.Sprintf("%d versions linked before the death", stored), func(t *testing.T) {
			t.Parallel()
			e := newBareEnv(t)
			rc, ev := e.diedBeforeLinks([]string{"a", "b"}, 2, stored)
			cfg := logBatchesConfig()
			cfg.LogTailWindow = -1
			e.startIngestOn(cfg, e.store)
			e.sendFor(rc, ev("a", 3), wire.VerdictCommitted)
			copies, _ := e.logged()
			checkLogOrder(t, copies, map[string]int64{"a": 3, "b": 2})
		})
	}
}

// The server restarts with the tail of LEDGER_LOG's files cut: links the
// ingest had stored, and sent receipts for, are gone. The ingest's next
// links of those partitions store the lost commits first, from
// PostgreSQL, with the tail check off: LEDGER_LOG ends with every commit,
// in order. Switch: planLinks without its read of the rows above the
// chain's top; versions are missing.
func TestLinksLostAtTheTailAreStoredAgainBeforeTheNextOnes(t *testing.T) {
	t.Parallel()
	cfg := logBatchesConfig()
	cfg.LogTailWindow = -1 // the chain alone puts them back
	e := newEnv(t, cfg)
	rc := e.receipts("worker-a.1")
	gens := map[int]int64{}
	for p := range 4 {
		gens[p] = e.acquire(p, "worker-a.1", 120000).Generation
	}
	ev := func(k int, v int64) event {
		p := k % 4
		return event{id: newID(), partition: p, task: fmt.Sprintf("t-%d", k), holder: "worker-a.1",
			generation: gens[p], version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	const tasks = 40
	want := map[string]int64{}
	for v := int64(1); v <= 6; v++ {
		var last event
		for k := range tasks {
			last = ev(k, v)
			e.publish(last)
			want[last.task] = v
		}
		// One round at a time: several links per partition, some lost.
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, last.id).Verdict)
	}
	before, _ := e.logged()
	e.cutStreamTail(wire.StreamLog)
	after, _ := e.logged()
	require.Less(t, len(after), len(before), "the cut lost links")

	var next []event
	for k := range tasks {
		next = append(next, ev(k, 7))
		e.publish(next[k])
		want[next[k].task] = 7
	}
	for _, n := range next {
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, n.id).Verdict, "the ingest keeps committing")
	}
	copies, _ := e.logged()
	checkLogOrder(t, copies, want)
}

// An ingest of per-event copies is followed by one writing log batches (an
// upgrade): each task's versions stay in order across the two forms.
func TestLogBatchesFollowPerEventCopiesInOrder(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	old, _ := e.startIngestOn(ingest.Config{AckWait: 5 * time.Second, StopTimeout: time.Second}, e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(8, "worker-a.1", 120000)
	ev := func(task string, v int64) event {
		return event{id: newID(), partition: 8, task: task, holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	for v := int64(1); v <= 2; v++ {
		for _, task := range []string{"a", "b"} {
			e.sendFor(rc, ev(task, v), wire.VerdictCommitted)
		}
	}
	old.Stop()
	e.startIngestOn(logBatchesConfig(), e.store)
	e.sendFor(rc, ev("a", 3), wire.VerdictCommitted)
	copies, _ := e.logged()
	checkLogOrder(t, copies, map[string]int64{"a": 3, "b": 2})
	require.True(t, copies[len(copies)-1].batched, "version 3 is in a batch")
}

// The same event sent again under a new id is a duplicate: it gets its
// receipt, and LEDGER_LOG no second copy (with log batches, a duplicate's
// commit is in the chain already).
func TestADuplicateAddsNoLink(t *testing.T) {
	t.Parallel()
	e := newEnv(t, logBatchesConfig())
	rc := e.receipts("worker-a.1")
	l := e.acquire(3, "worker-a.1", 120000)
	x := event{id: newID(), partition: 3, task: "a", holder: "worker-a.1", generation: l.Generation,
		version: 1, typ: "step", payload: `{"v":1}`}
	e.publish(x)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, x.id).Verdict)
	again := x
	again.id = newID()
	e.publish(again)
	require.Equal(t, wire.VerdictDuplicate, receiptFor(t, rc, again.id).Verdict)
	copies, msgs := e.logged()
	require.Len(t, copies, 1)
	require.Equal(t, 1, msgs)
}

// An append commits and its answer is lost (the connection is cut just
// then): the lane appends the batch again and finds every event committed,
// duplicates. Their commits are in no link yet, so the lane's next link
// holds them, before the versions after them. Switch: duplicates left out
// of cb.fresh (commit, pipeline.go); LEDGER_LOG then lacks version 1.
func TestCommitsWhoseAppendAnswerWasLostAreLinked(t *testing.T) {
	t.Parallel()
	var lost atomic.Int32
	cfg := ingest.WithTestHooks(logBatchesConfig(), ingest.TestHooks{LoseAppendAnswer: func() bool { return lost.Add(1) == 2 }})
	e := newEnv(t, cfg)
	rc := e.receipts("worker-a.1")
	l := e.acquire(5, "worker-a.1", 120000)
	ev := func(task string, v int64) event {
		return event{id: newID(), partition: 5, task: task, holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	e.sendFor(rc, ev("b", 1), wire.VerdictCommitted) // the partition's chain begins: the lane knows its top
	e.sendFor(rc, ev("a", 1), wire.VerdictDuplicate, "the second append found it committed")
	e.sendFor(rc, ev("a", 2), wire.VerdictCommitted)
	copies, _ := e.logged()
	checkLogOrder(t, copies, map[string]int64{"a": 2, "b": 1})
}

// An ingest dies with two tasks' commits unlinked. The first batch the new
// holder links holds only a re-send of one of them, whose seq is the lower:
// it still stores both before anything after them. Chaos found it: a
// recovery that read the partition's rows only up to its batch's last
// left the dead ingest's later commits out, and the next versions of
// their tasks were linked before them. Switch: read the rows above the
// top only up to the batch's last (planLinks); task b's version 2 then
// comes before its version 1.
func TestARecoveryStoresEveryUnlinkedCommitNotOnlyTheBatchs(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	rc, ev := e.diedBeforeLinks([]string{"a", "b"}, 1, 0)
	// LEDGER_IN loses the dead ingest's unacked messages (a storage loss
	// of its tail): nothing redelivers them.
	in, err := e.js.Stream(context.Background(), wire.StreamIn)
	require.NoError(t, err)
	require.NoError(t, in.Purge(context.Background()))
	cfg := logBatchesConfig()
	cfg.LogTailWindow = -1
	e.startIngestOn(cfg, e.store)
	e.sendFor(rc, ev("a", 1), wire.VerdictDuplicate) // a's version 1 sent again: a duplicate, the lower seq
	e.sendFor(rc, ev("b", 2), wire.VerdictCommitted)
	copies, _ := e.logged()
	checkLogOrder(t, copies, map[string]int64{"a": 1, "b": 2})
}

// sendFor publishes x and waits for its receipt, which must be verdict.
func (e *env) sendFor(rc *receiptBook, x event, verdict wire.Verdict, msgAndArgs ...any) {
	e.t.Helper()
	e.publish(x)
	require.Equal(e.t, verdict, receiptFor(e.t, rc, x.id).Verdict, msgAndArgs...)
}

// forged starts the body of a message no ingest wrote.
var forged = []byte("forged:")

// Something that is not a log batch is the partition's last message on
// its batch subject (only ingests and operators may publish there, but a
// mistake can). The lane's next link is refused (the junk is last), and it
// reads its chain again: it takes the junk's place in the chain, stores the
// partition's recent commits again from PostgreSQL, and goes on: every
// version is linked, in order, after it. Switch: readChain failing on a
// last link that does not read; the lane retries for ever and no receipt
// comes.
func TestAForgedLastLinkDoesNotWedgeTheLane(t *testing.T) {
	t.Parallel()
	e := newEnv(t, logBatchesConfig())
	rc := e.receipts("worker-a.1")
	l := e.acquire(6, "worker-a.1", 120000)
	ev := func(task string, v int64) event {
		return event{id: newID(), partition: 6, task: task, holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	e.sendFor(rc, ev("a", 1), wire.VerdictCommitted)
	junk := nats.NewMsg(e.subj.LogBatch(6))
	junk.Data = append(slices.Clone(forged), "not a batch"...)
	_, err := e.js.PublishMsg(context.Background(), junk)
	require.NoError(t, err)
	e.sendFor(rc, ev("a", 2), wire.VerdictCommitted, "the lane is wedged on the forged link")
	copies, _ := e.logged()
	checkLogOrder(t, copies, map[string]int64{"a": 2})
}
