package fence_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// An event judged gap is not committed by a later copy once its version 1
// arrived: the id keeps its recorded verdict, and no second row is written.
func TestRecordedRejectionIsFinal(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 0, "worker-a.1", longTTL)
	require.NoError(t, err)

	v1, e2 := ev(l, "report-7", 1, "running"), ev(l, "report-7", 2, "completed")
	timedOut := e2
	timedOut.Final = true
	r := appendOne(t, s, timedOut)
	require.Equal(t, wire.VerdictGap, r.Verdict)
	require.False(t, r.Repeat)
	require.Equal(t, wire.VerdictCommitted, appendOne(t, s, v1).Verdict)

	fresh, err := fence.New(db.Pool, fence.Config{}) // another ingest process: no cached head
	require.NoError(t, err)
	for _, store := range []*fence.Store{s, fresh} {
		again := appendOne(t, store, e2)
		require.Equal(t, wire.VerdictGap, again.Verdict, "a redelivered copy keeps the recorded verdict")
		require.Equal(t, wire.ReasonGapTimeout, again.Reason)
		require.True(t, again.Repeat)
		require.Nil(t, again.Committed)
	}
	require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE event_id = $1`, e2.ID))
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.rejections WHERE event_id = $1`, e2.ID), "one row per id")

	// A stale copy and a copy restamped with the valid lease, in one batch
	// and then again: the first verdict holds for both.
	old := ev(fence.Lease{Partition: 0, Holder: "worker-z.1", Generation: l.Generation}, "report-8", 1, "running")
	restamped := old
	restamped.Holder = "worker-a.1"
	res, err := s.Append(ctx, []fence.Event{old, restamped})
	require.NoError(t, err)
	require.Equal(t, wire.VerdictStale, res[0].Verdict)
	require.Equal(t, wire.ReasonNotHolder, res[0].Reason)
	require.Equal(t, res[0].Verdict, res[1].Verdict, "the second copy of the id in the batch")
	require.Equal(t, res[0].Reason, res[1].Reason)
	require.True(t, res[1].Repeat)
	later := appendOne(t, s, restamped)
	require.Equal(t, wire.VerdictStale, later.Verdict)
	require.True(t, later.Repeat)
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.rejections WHERE event_id = $1`, old.ID))
	require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE task_id = 'report-8'`))

	// A committed id stays a duplicate, as before.
	require.Equal(t, wire.VerdictDuplicate, appendOne(t, s, v1).Verdict)
}

// The race finality must survive: an ingest stalls holding E2, whose gap
// window closed while v1 was missing, and decides gap; meanwhile JetStream
// redelivers v1 and E2 to another ingest, which would commit them. The
// stalled append is paused between its reads and its write (beforeWrite)
// while the other appends run, until they finish or wait for its locks.
//
// The appends of a transaction that records a rejection hold the lease rows
// FOR UPDATE, so the other ingest waits, then reads the recorded gap: E2 has
// one verdict. The negative control records under the shared locks every
// append takes, and must end with E2 both rejected and committed.
func TestConcurrentRejectionAndCommitOfOneEventID(t *testing.T) {
	t.Parallel()
	t.Run("exclusive", func(t *testing.T) {
		t.Parallel()
		stalled, redelivered, committed, rejected := raceRejectionAndCommit(t, false)
		require.Equal(t, wire.VerdictGap, stalled.Verdict)
		require.Equal(t, wire.VerdictGap, redelivered.Verdict, "the redelivered copy must get the recorded verdict")
		require.True(t, redelivered.Repeat)
		require.Equal(t, 0, committed, "E2 is committed although it was rejected")
		require.Equal(t, 1, rejected)
	})
	t.Run("shared_control", func(t *testing.T) {
		t.Parallel()
		stalled, redelivered, committed, rejected := raceRejectionAndCommit(t, true)
		require.Equal(t, wire.VerdictGap, stalled.Verdict)
		require.Equal(t, wire.VerdictCommitted, redelivered.Verdict,
			"without exclusive locks the interleaving must give one id two verdicts, or the test proves nothing")
		require.Equal(t, 1, committed)
		require.Equal(t, 1, rejected)
	})
}

// raceRejectionAndCommit runs the interleaving and returns the stalled and
// the redelivered append's verdicts for E2 and E2's rows in ledger.events
// and ledger.rejections.
func raceRejectionAndCommit(t *testing.T, shared bool) (stalled, redelivered fence.Result, committed, rejected int) {
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 0, "worker-a.1", longTTL)
	require.NoError(t, err)
	v1, e2 := ev(l, "invoice-42", 1, "running"), ev(l, "invoice-42", 2, "completed")
	timedOut := e2
	timedOut.Final = true

	other, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	done := make(chan struct{})
	var otherErr error
	var once sync.Once
	paused := fence.BeforeWrite(s, func() {
		once.Do(func() {
			go func() {
				defer close(done)
				if _, otherErr = other.Append(ctx, []fence.Event{v1}); otherErr != nil {
					return
				}
				var res []fence.Result
				if res, otherErr = other.Append(ctx, []fence.Event{e2}); otherErr == nil {
					redelivered = res[0]
				}
			}()
			waitDoneOrBlocked(t, db, done)
		})
	})
	if shared {
		paused = fence.SharedRejectionLocks(paused)
	}
	stalled = appendOne(t, paused, timedOut)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the redelivered appends did not finish after the stalled one committed")
	}
	require.NoError(t, otherErr)
	committed = countRows(t, db, `SELECT count(*) FROM ledger.events WHERE event_id = $1`, e2.ID)
	rejected = countRows(t, db, `SELECT count(*) FROM ledger.rejections WHERE event_id = $1`, e2.ID)
	return stalled, redelivered, committed, rejected
}

// An append holds its lease rows FOR KEY SHARE: a renewal of the lease does
// not wait for it (a stream of appends cannot starve renewals), and a
// takeover does (the fence: every event of a generation precedes the grant
// of the next).
func TestAppendDoesNotBlockRenewButBlocksTakeover(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 1, "worker-a.1", longTTL)
	require.NoError(t, err)

	takeover := make(chan struct{})
	var took fence.Lease
	var tookErr error
	var once sync.Once
	paused := fence.BeforeWrite(s, func() {
		once.Do(func() {
			renewed := make(chan struct{})
			var renewErr error
			go func() {
				defer close(renewed)
				_, renewErr = s.Renew(ctx, 1, "worker-a.1", l.Generation, 0)
			}()
			require.False(t, waitDoneOrBlocked(t, db, renewed), "the renewal waits for the append's lock")
			require.NoError(t, renewErr)

			go func() {
				defer close(takeover)
				took, tookErr = s.Acquire(ctx, 1, "worker-a.1", longTTL) // a re-grant takes the row FOR UPDATE too
			}()
			require.True(t, waitDoneOrBlocked(t, db, takeover), "the takeover did not wait for the append")
		})
	})
	r := appendOne(t, paused, ev(l, "t", 1, "x"))
	require.Equal(t, wire.VerdictCommitted, r.Verdict, "the takeover waited, so the append's generation was current")
	<-takeover
	require.NoError(t, tookErr)
	require.Equal(t, l.Generation+1, took.Generation)
}

// A flood of another principal's events on a partition is judged stale
// beside the holder's commits, not in front of them: a rejection that no
// other append can undo (plan.undoable) is recorded under the shared lease
// locks. The flood's append is paused between its reads and its write
// while the holder commits and releases: neither waits for it. A grant
// still does, so the stale verdict stays final: once the flooder holds the
// partition at the very generation its event names, a copy of the event
// gets the recorded verdict again and commits nothing. The negative
// control decides every rejection under FOR UPDATE, as before: the
// holder's commit waits for the flood's append.
func TestStaleVerdictsDoNotHoldUpTheHoldersCommits(t *testing.T) {
	t.Parallel()
	for _, exclusive := range []bool{false, true} {
		t.Run(map[bool]string{false: "shared", true: "exclusive_control"}[exclusive], func(t *testing.T) {
			t.Parallel()
			s, db := newStore(t, fence.Config{})
			ctx := context.Background()
			a, err := s.Acquire(ctx, 0, "reports.a", longTTL)
			require.NoError(t, err)
			// The flooder names the generation it will be granted next.
			flood := ev(fence.Lease{Partition: 0, Holder: "billing.x", Generation: a.Generation + 1}, "bill-1", 1, "x")
			mine := ev(a, "report-1", 1, "running")

			holder, err := fence.New(db.Pool, fence.Config{}) // the holder's events, decided beside the flood
			require.NoError(t, err)
			var committedBeside bool
			done := make(chan struct{})
			var r fence.Result
			var appendErr error
			var acquired fence.Lease
			var acquireErr error
			granted := make(chan struct{})
			var once sync.Once
			paused := fence.BeforeWrite(s, func() {
				once.Do(func() {
					go func() {
						defer close(done)
						var res []fence.Result
						if res, appendErr = holder.Append(ctx, []fence.Event{mine}); appendErr == nil {
							r = res[0]
						}
					}()
					if waitDoneOrBlocked(t, db, done) {
						return // the holder waits; the flood's append goes on
					}
					require.NoError(t, appendErr)
					require.Equal(t, wire.VerdictCommitted, r.Verdict)
					require.NoError(t, holder.Release(ctx, 0, "reports.a", a.Generation))
					committedBeside = true
					go func() {
						defer close(granted)
						acquired, acquireErr = holder.Acquire(ctx, 0, "billing.x", longTTL)
					}()
					require.True(t, waitDoneOrBlocked(t, db, granted), "a grant must wait for the stale verdict's append")
				})
			})
			if exclusive {
				paused = fence.AllRejectionsExclusive(paused)
			}
			stale := appendOne(t, paused, flood)
			require.Equal(t, wire.VerdictStale, stale.Verdict)
			require.Equal(t, wire.ReasonNotHolder, stale.Reason)
			<-done
			require.NoError(t, appendErr)
			require.Equal(t, wire.VerdictCommitted, r.Verdict)
			if exclusive {
				require.False(t, committedBeside, "under FOR UPDATE the holder's commit must wait, or the test proves nothing")
				return
			}
			require.True(t, committedBeside, "the holder's commit waited for another principal's stale event")

			<-granted
			require.NoError(t, acquireErr)
			require.Equal(t, flood.Generation, acquired.Generation)
			again := appendOne(t, s, flood)
			require.Equal(t, wire.VerdictStale, again.Verdict, "the flooder's own grant does not undo the verdict")
			require.True(t, again.Repeat)
			require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE event_id = $1`, flood.ID))
			require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.rejections WHERE event_id = $1`, flood.ID))
		})
	}
}
