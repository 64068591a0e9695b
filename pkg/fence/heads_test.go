package fence_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// Dense versions (doc.go, Dense versions): writers racing on one task, each
// with its own Store (its own cache of heads) and the same lease, all read
// the head and then append head + 1 with content of their own at once. In
// every round exactly one commits; the task's versions stay 1, 2, 3, ...
// with no version twice. The negative control moves heads without checking
// the version they move from, and must commit some version twice.
func TestWritersRacingOnOneTaskAreSerialised(t *testing.T) {
	t.Parallel()
	t.Run("serialised", func(t *testing.T) {
		t.Parallel()
		committed, versions := raceOnOneTask(t, nil)
		require.Equal(t, committed, len(versions), "every commit is a row, and no version has two")
		for i, v := range versions {
			require.EqualValues(t, i+1, v, "versions are dense")
		}
	})
	t.Run("unserialised_control", func(t *testing.T) {
		t.Parallel()
		_, versions := raceOnOneTask(t, fence.UnserialisedHeads)
		twice := 0
		for i := 1; i < len(versions); i++ {
			if versions[i] == versions[i-1] {
				twice++
			}
		}
		require.Positive(t, twice, "without the heads check no version was committed twice: the test could not fail")
		t.Logf("without the heads check %d versions were committed twice", twice)
	})
}

// raceOnOneTask runs the race and returns how many appends committed and
// the task's versions as ledger.events holds them, in order.
func raceOnOneTask(t *testing.T, control func(*fence.Store) *fence.Store) (int, []int64) {
	const writers, rounds = 6, 40
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 0, "worker-a.1", longTTL)
	require.NoError(t, err)
	stores := make([]*fence.Store, writers)
	for i := range stores {
		st, err := fence.New(db.Pool, fence.Config{})
		require.NoError(t, err)
		if control != nil {
			st = control(st)
		}
		stores[i] = st
	}
	committed := 0
	for r := range rounds {
		h, err := s.TaskHead(ctx, "shared")
		require.NoError(t, err)
		var wg sync.WaitGroup
		start := make(chan struct{})
		results := make([]fence.Result, writers)
		errs := make([]error, writers)
		for w := range writers {
			wg.Go(func() {
				e := ev(l, "shared", h.Version+1, "step")
				e.Payload = []byte(fmt.Sprintf(`{"round":%d,"writer":%d}`, r, w))
				<-start
				res, err := stores[w].Append(ctx, []fence.Event{e})
				errs[w] = err
				if err == nil {
					results[w] = res[0]
				}
			})
		}
		close(start)
		wg.Wait()
		for w := range writers {
			require.NoError(t, errs[w])
			switch results[w].Verdict {
			case wire.VerdictCommitted:
				committed++
			case wire.VerdictConflict:
				require.Equal(t, wire.ReasonVersionTaken, results[w].Reason)
			default:
				t.Fatalf("round %d writer %d: %s/%s", r, w, results[w].Verdict, results[w].Reason)
			}
		}
	}
	rows, err := db.Pool.Query(ctx, `SELECT version FROM ledger.events WHERE task_id = 'shared' ORDER BY version, seq`)
	require.NoError(t, err)
	var versions []int64
	for rows.Next() {
		var v int64
		require.NoError(t, rows.Scan(&v))
		versions = append(versions, v)
	}
	require.NoError(t, rows.Err())
	return committed, versions
}

// Partitions of ledger.events are made by the appends themselves as they
// near the end: 600 events cross thirty partitions of 20 rows, and every
// one commits. The negative control makes no partitions, and its appends
// fail once the ones made at the start are full.
func TestAppendsMakePartitionsAheadOfNeed(t *testing.T) {
	t.Parallel()
	appendAcross := func(t *testing.T, control bool) error {
		db := dbtest.New(t)
		s := smallPartitions(t, db, fence.Config{}, 20)
		if control {
			s = fence.WithoutPartitionKeeping(s)
		}
		ctx := context.Background()
		l, err := s.Acquire(ctx, 0, "worker-a.1", longTTL)
		require.NoError(t, err)
		for b := range 20 {
			batch := make([]fence.Event, 30)
			for i := range batch {
				batch[i] = ev(l, fmt.Sprintf("t%d", i), int64(b+1), "step")
			}
			res, err := s.Append(ctx, batch)
			if err != nil {
				return err
			}
			for _, r := range res {
				require.Equal(t, wire.VerdictCommitted, r.Verdict)
			}
		}
		require.Equal(t, 600, countRows(t, db, `SELECT count(*) FROM ledger.events`))
		require.GreaterOrEqual(t, countRows(t, db, `SELECT count(*) FROM ledger.event_partitions`), 30)
		require.Eventually(t, func() bool {
			return countRows(t, db, `SELECT count(*) FROM ledger.event_partitions
				WHERE lo > (SELECT max(seq) FROM ledger.events)`) >= 1
		}, 10*time.Second, 10*time.Millisecond, "a whole partition is ready beyond the newest seq")
		return nil
	}
	t.Run("kept", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, appendAcross(t, false))
	})
	t.Run("not_kept_control", func(t *testing.T) {
		t.Parallel()
		err := appendAcross(t, true)
		require.Error(t, err, "without partition keeping the appends still found partitions: the test could not fail")
		require.Contains(t, err.Error(), "no partition of relation")
	})
}

// The append writes where each head moved from itself (migration 00020), so
// the database fence's row trigger, a PL/pgSQL call for each head a
// statement moves, is never called: pg_stat_user_functions counts no call
// of ledger.heads_moved_from while it counts the insert's own
// ledger.fence_check once an append. The values are the ones the trigger
// would write: 0 for a new head, the version it moved from for the rest.
func TestTheAppendWritesWhereHeadsMovedFrom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	cfg := db.Pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["track_functions"] = "pl"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	s, err := fence.New(pool, fence.Config{})
	require.NoError(t, err)
	l, err := s.Acquire(ctx, 3, "moves.a", time.Minute)
	require.NoError(t, err)
	for _, batch := range [][]fence.Event{
		{ev(l, "mf-a", 1, "t"), ev(l, "mf-a", 2, "t"), ev(l, "mf-b", 1, "t")},
		{ev(l, "mf-a", 3, "t"), ev(l, "mf-b", 2, "t"), ev(l, "mf-b", 3, "t"), ev(l, "mf-c", 1, "t")},
	} {
		res, err := s.Append(ctx, batch)
		require.NoError(t, err)
		for _, r := range res {
			require.Equal(t, wire.VerdictCommitted, r.Verdict, r.Reason)
		}
	}
	want := map[string]int64{"mf-a": 2, "mf-b": 1, "mf-c": 0}
	for task, from := range want {
		var got int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT moved_from FROM ledger.heads WHERE task_id = $1`, task).Scan(&got))
		require.Equal(t, from, got, "%s moved from", task)
	}

	pool.Close() // a session reports its function statistics as it ends
	calls := func(fn string) int64 {
		var n int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
			WHERE schemaname = 'ledger' AND funcname = $1`, fn).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return calls("fence_check") >= 2 }, 10*time.Second, 20*time.Millisecond,
		"the appends' sessions reported their calls")
	require.Zero(t, calls("heads_moved_from"), "the row trigger ran for a head the append moved")
}
