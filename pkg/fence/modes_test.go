package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// The shadow fence: a zombie's late write on a partition in observe mode
// commits, and says that enforce would have refused it as
// stale/superseded; versions stay dense and conflicts and gaps are
// unchanged; switched back to enforce, the same zombie is refused.
func TestObserveModeCommitsWhatEnforceWouldRefuseAndSaysSo(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	start := time.Now().Add(-time.Minute)

	a, err := s.Acquire(ctx, 3, "worker-a.1", longTTL)
	require.NoError(t, err)
	r := appendOne(t, s, ev(a, "job-1", 1, "running"))
	require.Equal(t, wire.VerdictCommitted, r.Verdict)
	require.Equal(t, fence.ModeEnforce, r.FenceMode, "every result carries the effective mode")

	_, err = fence.SetFenceMode(ctx, db.Pool, 3, fence.ModeObserve, "ops", "rollout step 1")
	require.NoError(t, err)
	expire(t, db, 3)
	b, err := s.Acquire(ctx, 3, "worker-a.2", longTTL)
	require.NoError(t, err)
	rb := appendOne(t, s, ev(b, "job-1", 2, "running"))
	require.Equal(t, wire.VerdictCommitted, rb.Verdict)
	require.Equal(t, fence.ModeObserve, rb.FenceMode)
	require.Empty(t, rb.WouldReject)

	zombie := appendOne(t, s, ev(a, "job-1", 3, "completed"))
	require.Equal(t, wire.VerdictCommitted, zombie.Verdict, "observe commits what enforce would refuse")
	require.Equal(t, "stale/superseded", zombie.WouldReject)
	require.Equal(t, fence.ModeObserve, zombie.FenceMode)
	require.NotNil(t, zombie.Committed)
	require.Equal(t, "stale/superseded", zombie.Committed.WouldReject, "the log copy says it too")
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.events
		WHERE task_id = 'job-1' AND version = 3 AND holder = 'worker-a.1' AND would_reject = 'stale/superseded'`))

	// Everything but the fence is unchanged: a taken version is a
	// conflict, a version far ahead waits or is a gap.
	taken := appendOne(t, s, ev(a, "job-1", 3, "other"))
	require.Equal(t, wire.VerdictConflict, taken.Verdict)
	require.Empty(t, taken.WouldReject)
	ahead := ev(a, "job-1", 9, "x")
	ahead.Final = true
	gap := appendOne(t, s, ahead)
	require.Equal(t, wire.VerdictGap, gap.Verdict)
	require.Empty(t, gap.WouldReject)

	report, err := fence.WouldReject(ctx, db.Pool, []int32{3}, start)
	require.NoError(t, err)
	require.Len(t, report, 1)
	require.Equal(t, "stale/superseded", report[0].WouldReject)
	require.EqualValues(t, 1, report[0].Count)

	_, err = fence.SetFenceMode(ctx, db.Pool, 3, fence.ModeEnforce, "ops", "the count stayed 0")
	require.NoError(t, err)
	refused := appendOne(t, s, ev(a, "job-1", 4, "completed"))
	require.Equal(t, wire.VerdictStale, refused.Verdict)
	require.Equal(t, wire.ReasonSuperseded, refused.Reason)
	require.Equal(t, fence.ModeEnforce, refused.FenceMode)

	modes, err := fence.FenceModes(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, modes, 1)
	require.Equal(t, fence.ModeEnforce, modes[0].Mode)
	acts, err := fence.Actions(ctx, db.Pool, 3, 10)
	require.NoError(t, err)
	require.Len(t, acts, 2)
	require.Equal(t, fence.ModeEnforce, acts[0].Kind)
	require.Equal(t, fence.ModeObserve, acts[1].Kind)
	require.Equal(t, "rollout step 1", acts[1].Reason)
}

// A partition never leased has no lease row to commit against: its events
// are refused stale/no_lease in observe mode too.
func TestObserveModeStillRefusesAPartitionNeverLeased(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	_, err := fence.SetFenceMode(context.Background(), db.Pool, 6, fence.ModeObserve, "ops", "rollout")
	require.NoError(t, err)
	r := appendOne(t, s, ev(fence.Lease{Partition: 6, Holder: "worker-a.1", Generation: 1}, "job-2", 1, "x"))
	require.Equal(t, wire.VerdictStale, r.Verdict)
	require.Equal(t, wire.ReasonNoLease, r.Reason)
}

// A valid holder's events on an observe partition take the fast path
// and still report the mode read under the lease lock.
func TestFastPathReportsTheLockedMode(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	a, err := s.Acquire(ctx, 1, "worker-a.1", longTTL)
	require.NoError(t, err)
	require.Equal(t, fence.ModeEnforce, appendOne(t, s, ev(a, "job-3", 1, "x")).FenceMode)
	_, err = fence.SetFenceMode(ctx, db.Pool, 1, fence.ModeObserve, "ops", "rollout")
	require.NoError(t, err)
	before, _ := s.FastPath()
	r := appendOne(t, s, ev(a, "job-3", 2, "x"))
	after, _ := s.FastPath()
	require.Equal(t, wire.VerdictCommitted, r.Verdict)
	require.Greater(t, after, before, "the batch took the fast path")
	require.Equal(t, fence.ModeObserve, r.FenceMode, "the mode is the one read under the lock, not the one predicted")
}
