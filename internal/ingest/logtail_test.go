package ingest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

// cutStreamTail stops the NATS server, cuts the newest block file of
// stream to half its size, as a power loss does to writes not yet synced,
// and starts the server again on the same store.
func (e *env) cutStreamTail(stream string) {
	e.t.Helper()
	e.ns.Shutdown()
	blocks, err := filepath.Glob(filepath.Join(e.ns.StoreDir(), "jetstream", "*", "streams", stream, "msgs", "*.blk"))
	require.NoError(e.t, err)
	require.NotEmpty(e.t, blocks, "the stream's block files")
	slices.SortFunc(blocks, func(a, b string) int { return blockIndex(a) - blockIndex(b) })
	last := blocks[len(blocks)-1]
	info, err := os.Stat(last)
	require.NoError(e.t, err)
	require.NoError(e.t, os.Truncate(last, info.Size()/2))
	e.ns.Restart(e.t)
}

func blockIndex(path string) int {
	n, _ := strconv.Atoi(filepath.Base(path[:len(path)-len(".blk")]))
	return n
}

// lastLogged is the version of a task's last copy in LEDGER_LOG; 0 if none.
func (e *env) lastLogged(partition int, task string) int64 {
	e.t.Helper()
	s, err := e.js.Stream(context.Background(), wire.StreamLog)
	require.NoError(e.t, err)
	m, err := s.GetLastMsgForSubject(context.Background(), e.subj.Log(partition, task))
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(m.Header.Get(wire.HeaderVersion), 10, 64)
	return v
}

// The server restarts with the tail of LEDGER_LOG's files cut: copies the
// ingest had stored, and sent receipts for, are gone. The ingest publishes
// them again from PostgreSQL when it reconnects, in version order, and
// keeps committing: the memory check takes the shorter log for what it is.
func TestLogCopiesLostAtTheTailArePublishedAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{AckWait: 5 * time.Second, StopTimeout: time.Second})
	rc := e.receipts("worker-a.1")
	l := e.acquire(4, "worker-a.1", 120000)
	ev := func(task string, v int64) event {
		return event{id: newID(), partition: 4, task: task, holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	const tasks, versions = 20, 3
	var last event
	for k := range tasks {
		for v := int64(1); v <= versions; v++ {
			last = ev(fmt.Sprintf("t-%d", k), v)
			e.publish(last)
		}
	}
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, last.id).Verdict)
	require.Eventually(t, func() bool { return e.streamPending(wire.StreamLog) == tasks*versions }, 10*time.Second, 10*time.Millisecond)

	// The ingest reconnects and puts the copies back while the server
	// comes up, often before the test could look: its count of copies
	// put back says that the cut lost some.
	e.cutStreamTail(wire.StreamLog)
	require.Eventually(t, func() bool { return ingest.LogCopiesRestored(e.svc) > 0 }, 20*time.Second,
		10*time.Millisecond, "the cut lost copies, and the tail check put them back")

	// Half the tasks get their next version at once: its copy must come
	// after the ones put back, not fill the log's hole from above.
	var next []event
	for k := 0; k < tasks; k += 2 {
		next = append(next, ev(fmt.Sprintf("t-%d", k), versions+1))
		e.publish(next[len(next)-1])
	}
	for _, n := range next {
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, n.id).Verdict, "the ingest keeps committing")
	}
	for k := range tasks {
		task := fmt.Sprintf("t-%d", k)
		want := []string{"1", "2", "3"}
		if k%2 == 0 {
			want = append(want, "4")
		}
		require.Eventually(t, func() bool { return e.lastLogged(4, task) == int64(len(want)) }, 20*time.Second, 20*time.Millisecond,
			"task %s's last copy is back", task)
		require.Equal(t, want, e.logVersions(4, task), "task %s: in version order, once each", task)
	}
	require.NoError(t, e.svc.CheckMemory(context.Background()))
}

// After a loss a batch can hold a re-sent, already committed version of a
// task next to the task's new version, with the versions between them gone
// from LEDGER_LOG. The ingest that takes the partition over (its lane
// remembers nothing) stores the missing versions before the new one.
// Chaos found it: a re-sent v209 and a new v329 in one batch, v329 stored
// right after v209. Switch: in precedingCopies look only at each task's
// first copy in the batch (the old rule): LEDGER_LOG holds 1, 2, 5.
func TestAnOldDuplicateInABatchDoesNotHideTheVersionsLostBeforeItsNewOne(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	cfg := ingest.Config{AckWait: 5 * time.Second, StopTimeout: time.Second, LogTailWindow: -1,
		Lanes: 1, BatchWait: 300 * time.Millisecond}
	first, _ := e.startIngestOn(cfg, e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(4, "worker-a.1", 120000)
	ev := func(v int64) event {
		return event{id: newID(), partition: 4, task: "dup", holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	var sent []event
	for v := int64(1); v <= 4; v++ {
		sent = append(sent, ev(v))
		e.publish(sent[v-1])
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, sent[v-1].id).Verdict)
	}
	require.Equal(t, []string{"1", "2", "3", "4"}, e.logVersions(4, "dup"))

	// The loss: versions 3 and 4's copies are gone, and with the restart
	// from LEDGER_LOG's duplicate window too.
	first.Stop()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, wire.StreamLog)
	require.NoError(t, err)
	for _, m := range e.streamMsgs(wire.StreamLog, e.subj.Log(4, "dup"))[2:] {
		md, err := m.Metadata()
		require.NoError(t, err)
		require.NoError(t, st.DeleteMsg(ctx, md.Sequence.Stream))
	}
	e.ns.Shutdown()
	e.ns.Restart(t)

	// Version 2 re-sent under its bare event id (not deduplicated by
	// LEDGER_IN, as after a loss), then version 5: one batch for the next ingest.
	again := e.msg(sent[1])
	again.Header.Set(wire.HeaderMsgID, sent[1].id)
	e.publishMsg(again)
	v5 := ev(5)
	e.publish(v5)
	e.startIngestOn(cfg, e.store)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, v5.id).Verdict)
	require.Eventually(t, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rs := rc.byID[sent[1].id]
		return len(rs) == 2 && rs[1].Verdict == wire.VerdictDuplicate
	}, 30*time.Second, 10*time.Millisecond, "the re-send is answered duplicate")
	require.Equal(t, []string{"1", "2", "3", "4", "5"}, e.logVersions(4, "dup"))
}

// A LEDGER_LOG that lost a copy the lane remembers storing, with no
// reconnect to tell it: one server of an R3 stream that lost its tail can
// become the leader so. Each task's first copy in a batch names the
// sequence of the copy before it (Nats-Expected-Last-Subject-Sequence):
// the stream refuses a copy whose predecessor it lost, and the lane puts
// the predecessor back first. Here the loss is the deleted copy of version
// 2, with LEDGER_LOG's duplicate window shrunk so that its put-back is
// stored. Chaos found it on the cluster: v376 stored right after v206.
// Switch: TestHooks.NoLogExpectations: LEDGER_LOG holds 1, 3.
func TestACopyWhosePredecessorTheStreamLostWaitsForItsPutBack(t *testing.T) {
	t.Parallel()
	got, _ := afterALostPredecessor(t, ingest.TestHooks{}, 1, false)
	require.Equal(t, []string{"1", "2", "3"}, got)
}

// The same loss with two new versions in one batch: the later one goes in
// a second round, once the first is stored, so nothing is stored past the
// refused one. Switch: TestHooks.OneRound (both at once): LEDGER_LOG holds
// 1, 4, 3.
func TestALaterVersionInTheBatchIsNotStoredPastARefusedCopy(t *testing.T) {
	t.Parallel()
	got, _ := afterALostPredecessor(t, ingest.TestHooks{}, 2, false)
	require.Equal(t, []string{"1", "2", "3", "4"}, got)
}

// A refused copy starts the batch's copies over, and the dead letters
// stored in the first round are not stored again: one without a
// Nats-Msg-Id (an invalid event that lacks it) would be stored twice. The
// review of the refusal found it (a reconnect did the same before).
// Switch: committedBatch.letterStored always false: LEDGER_DLQ holds 2.
func TestARefusedLogCopyStoresTheBatchsDeadLettersOnce(t *testing.T) {
	t.Parallel()
	got, letters := afterALostPredecessor(t, ingest.TestHooks{}, 1, true)
	require.Equal(t, []string{"1", "2", "3"}, got)
	require.Equal(t, 1, letters, "the letter is stored once")
}

// A worker re-sends version 2 past LEDGER_LOG's duplicate window, in one
// batch with versions 5 and 6. The lane knows LEDGER_LOG holds version 4,
// so the old version's copy is not stored again: as the task's last copy
// it would make the stream refuse version 5, and the lane would put back
// 3 and 4 again (or, in one round, store 6 before 5). The review of the
// expectations found it. Switch: in planCopies publish an old version's
// copy (the first rule): LEDGER_LOG holds 1, 2, 3, 4, 2, 3, 4, 5, 6 (the
// review saw 1, 2, 3, 4, 2, 6, 5 in one round).
func TestAnOldReSendBesideNewVersionsIsNotStoredAgain(t *testing.T) {
	t.Parallel()
	for _, oneRound := range []bool{false, true} {
		t.Run(fmt.Sprintf("oneRound=%v", oneRound), func(t *testing.T) {
			t.Parallel()
			e := newBareEnv(t)
			cfg := ingest.WithTestHooks(ingest.Config{AckWait: 5 * time.Second, StopTimeout: time.Second,
				LogTailWindow: -1, Lanes: 1, BatchWait: 300 * time.Millisecond}, ingest.TestHooks{OneRound: oneRound})
			first, _ := e.startIngestOn(cfg, e.store)
			rc := e.receipts("worker-a.1")
			l := e.acquire(4, "worker-a.1", 120000)
			ev := func(v int64) event {
				return event{id: newID(), partition: 4, task: "resent", holder: "worker-a.1", generation: l.Generation,
					version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
			}
			var sent []event
			for v := int64(1); v <= 4; v++ {
				sent = append(sent, ev(v))
				e.publish(sent[v-1])
				require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, sent[v-1].id).Verdict)
			}
			first.Stop()
			e.shrinkLogDuplicates()

			// Version 2 under its bare event id (not deduplicated by
			// LEDGER_IN), then 5 and 6: one batch for the next ingest.
			again := e.msg(sent[1])
			again.Header.Set(wire.HeaderMsgID, sent[1].id)
			e.publishMsg(again)
			v5, v6 := ev(5), ev(6)
			e.publish(v5)
			e.publish(v6)
			e.startIngestOn(cfg, e.store)
			require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, v5.id).Verdict)
			require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, v6.id).Verdict)
			require.Equal(t, []string{"1", "2", "3", "4", "5", "6"}, e.logVersions(4, "resent"))
		})
	}
}

// shrinkLogDuplicates sets LEDGER_LOG's duplicate window to 100 ms and
// waits it out: the copies stored so far are no longer deduplicated, as
// after the stream's 10 minutes.
func (e *env) shrinkLogDuplicates() {
	e.t.Helper()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, wire.StreamLog)
	require.NoError(e.t, err)
	info, err := st.Info(ctx)
	require.NoError(e.t, err)
	scfg := info.Config
	// nats-server (2.15.2) fires its purge of old ids a microsecond after
	// an update that changes the window, but sets the new window later in
	// the update: on a loaded machine the purge can run with the old one
	// and keep every id for minutes, the put-back is deduplicated, and the
	// next version is stored after version 1. A second update fires the
	// purge again with the new window in place.
	for _, d := range []time.Duration{101 * time.Millisecond, 100 * time.Millisecond} {
		scfg.Duplicates = d
		_, err = e.js.UpdateStream(ctx, scfg)
		require.NoError(e.t, err)
	}
	time.Sleep(500 * time.Millisecond)
}

// afterALostPredecessor commits versions 1 and 2 of a task, deletes
// version 2's copy from LEDGER_LOG without a reconnect, commits n more in
// one batch (with letter, beside an invalid event without a Nats-Msg-Id),
// and returns the versions LEDGER_LOG holds, in stream order, and the
// number of dead letters.
func afterALostPredecessor(t *testing.T, hooks ingest.TestHooks, n int, letter bool) ([]string, int) {
	e := newBareEnv(t)
	cfg := ingest.Config{AckWait: 5 * time.Second, StopTimeout: time.Second, LogTailWindow: -1, Lanes: 1,
		BatchWait: 300 * time.Millisecond}
	_, nc := e.startIngestOn(ingest.WithTestHooks(cfg, hooks), e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(4, "worker-a.1", 120000)
	ev := func(v int64) event {
		return event{id: newID(), partition: 4, task: "lost", holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	for v := int64(1); v <= 2; v++ {
		x := ev(v)
		e.publish(x)
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, x.id).Verdict)
	}
	require.Equal(t, []string{"1", "2"}, e.logVersions(4, "lost"))

	ctx := context.Background()
	st, err := e.js.Stream(ctx, wire.StreamLog)
	require.NoError(t, err)
	copies := e.streamMsgs(wire.StreamLog, e.subj.Log(4, "lost"))
	md, err := copies[1].Metadata()
	require.NoError(t, err)
	require.NoError(t, st.DeleteMsg(ctx, md.Sequence.Stream))
	e.shrinkLogDuplicates() // the put-back is stored, not deduplicated
	reconnects := nc.Stats().Reconnects

	var next []event
	for v := int64(3); v < int64(3+n); v++ {
		next = append(next, ev(v))
		e.publish(next[len(next)-1])
	}
	if letter {
		bad := e.msg(ev(1))
		bad.Subject = e.subj.In("worker-a.1", 4, "other")
		bad.Header.Del(wire.HeaderMsgID)
		e.publishMsg(bad)
	}
	for _, x := range next {
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, x.id).Verdict)
	}
	require.Equal(t, reconnects, nc.Stats().Reconnects, "no reconnect told the lane")
	if letter {
		require.Eventually(t, func() bool { return len(e.streamMsgs(wire.StreamDLQ, "")) > 0 }, 20*time.Second,
			10*time.Millisecond, "the invalid event's dead letter")
	}
	return e.logVersions(4, "lost"), len(e.streamMsgs(wire.StreamDLQ, ""))
}

// moveIntoLogBatch replaces a task's last per-event copy in LEDGER_LOG with
// a log batch holding the same event, as an ingest that writes batches
// would have stored it.
func (e *env) moveIntoLogBatch(partition int, task string) wire.LogCopy {
	e.t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, wire.StreamLog)
	require.NoError(e.t, err)
	m, err := s.GetLastMsgForSubject(ctx, e.subj.Log(partition, task))
	require.NoError(e.t, err)
	c, err := e.subj.DecodeLog(m.Subject, m.Header, m.Data)
	require.NoError(e.t, err)
	require.NoError(e.t, s.DeleteMsg(ctx, m.Sequence))
	msgs, err := e.subj.LogBatchMsgs([]wire.LogCopy{c}, 1<<20)
	require.NoError(e.t, err)
	require.Len(e.t, msgs, 1)
	_, err = e.js.PublishMsg(ctx, msgs[0])
	require.NoError(e.t, err)
	return c
}

// A task's newest versions stored in a log batch (by an ingest that writes
// them) are in LEDGER_LOG though its own subject's last copy is older:
// the tail check publishes nothing again. It reads them with direct gets:
// the ingest's NATS permissions allow no consumer on LEDGER_LOG
// (TestAuthorizedDeployments). Switch: checkLogTail without the batched
// versions (logtail.go) publishes version 3 again.
func TestTheTailCheckCountsTheVersionsInLogBatches(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	cfg := ingest.Config{AckWait: 5 * time.Second, StopTimeout: time.Second}
	first, _ := e.startIngestOn(cfg, e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(4, "worker-a.1", 120000)
	for v := int64(1); v <= 3; v++ {
		x := event{id: newID(), partition: 4, task: "in-batch", holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
		e.publish(x)
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, x.id).Verdict)
	}
	first.Stop()
	moved := e.moveIntoLogBatch(4, "in-batch")
	require.EqualValues(t, 3, moved.Version)
	require.Equal(t, []string{"1", "2"}, e.logVersions(4, "in-batch"))

	second, _ := e.startIngestOn(cfg, e.store)
	n, err := ingest.CheckLogTail(context.Background(), second)
	require.NoError(t, err)
	require.Zero(t, n, "the copies published again")
	require.Zero(t, ingest.LogCopiesRestored(second))
	require.Equal(t, []string{"1", "2"}, e.logVersions(4, "in-batch"), "no per-event copy of version 3 again")
}
