package fence_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// A batch of next versions under the lease the store last read is sent in
// one round trip (the fast path) and commits; the careful path alone gives
// the same verdicts.
func TestPredictedBatchCommitsOnTheFastPath(t *testing.T) {
	t.Parallel()
	for _, careful := range []bool{false, true} {
		s, db := newStore(t, fence.Config{})
		if careful {
			s = fence.WithoutFastPath(s)
		}
		ctx := context.Background()
		l, err := s.Acquire(ctx, 3, "worker-a.1", longTTL)
		require.NoError(t, err)
		// The first batch reads: no head is cached, no lease was read.
		require.Equal(t, wire.VerdictCommitted, appendOne(t, s, ev(l, "fast-1", 1, "step")).Verdict)
		fast, _ := s.FastPath()
		require.Zero(t, fast, "nothing to predict from yet")

		// Versions 3 and 2, out of order: the append commits them in order.
		res, err := s.Append(ctx, []fence.Event{ev(l, "fast-1", 3, "step"), ev(l, "fast-1", 2, "step")})
		require.NoError(t, err)
		require.Equal(t, wire.VerdictCommitted, res[0].Verdict)
		require.Equal(t, wire.VerdictCommitted, res[1].Verdict)
		require.Less(t, res[1].Seq, res[0].Seq)
		require.Equal(t, l.Generation, res[1].CurrentGeneration)
		require.Equal(t, 3, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE task_id = 'fast-1'`))
		require.Equal(t, 3, countRows(t, db, `SELECT version FROM ledger.heads WHERE task_id = 'fast-1'`))
		fast, missed := s.FastPath()
		if careful {
			require.Zero(t, fast)
		} else {
			require.Equal(t, int64(1), fast, "the second batch took the fast path")
			require.Zero(t, missed)
		}
	}
}

// A zombie: its store last read the lease as its own, then the lease
// expired and another holder took it. Its next batch is predicted to
// commit; the fence in the transaction refuses it before COMMIT, and the
// batch is decided again from what the database holds: stale, superseded,
// nothing written.
func TestZombieOnTheFastPathIsDecidedFromTheDatabase(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	a, err := s.Acquire(ctx, 5, "worker-a.1", longTTL)
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, appendOne(t, s, ev(a, "zombie-1", 1, "step")).Verdict)

	expire(t, db, 5)
	other, err := fence.New(db.Pool, fence.Config{}) // the standby's ingest
	require.NoError(t, err)
	b, err := other.TakeOver(ctx, 5, "worker-b.1", a.Generation, longTTL)
	require.NoError(t, err)

	late := ev(a, "zombie-1", 2, "step")
	r := appendOne(t, s, late)
	require.Equal(t, wire.VerdictStale, r.Verdict)
	require.Equal(t, wire.ReasonSuperseded, r.Reason)
	require.Equal(t, b.Generation, r.CurrentGeneration)
	fast, missed := s.FastPath()
	require.Equal(t, int64(1), fast, "the zombie's batch was predicted to commit")
	require.Equal(t, int64(1), missed)
	require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE event_id = $1`, late.ID))
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.rejections WHERE event_id = $1`, late.ID))

	// The standby's version 2 commits.
	require.Equal(t, wire.VerdictCommitted, appendOne(t, other, ev(b, "zombie-1", 2, "step")).Verdict)
}
