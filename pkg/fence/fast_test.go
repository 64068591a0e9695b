package fence_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
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

// New tasks take the fast path: a task this store holds no head of is
// predicted new. One that another store wrote first is not new: the
// insert's heads check (or the ids' unique key) refuses the prediction,
// nothing is written, and the careful path gives the verdict. Switch: make
// predict leave the fast path for any task without a cached head, and the
// batch of new tasks takes two round trips.
func TestNewTasksTakeTheFastPathAndAHeadNotCachedIsChecked(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	other, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	l, err := s.Acquire(ctx, 2, "worker-a.1", longTTL)
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, appendOne(t, s, ev(l, "first", 1, "step")).Verdict, "reads the lease")

	var batch []fence.Event
	for k := range 5 {
		batch = append(batch, ev(l, fmt.Sprintf("new-%d", k), 1, "step"))
	}
	res, err := s.Append(ctx, batch)
	require.NoError(t, err)
	for _, r := range res {
		require.Equal(t, wire.VerdictCommitted, r.Verdict)
	}
	fast, missed := s.FastPath()
	require.Equal(t, []int64{1, 0}, []int64{fast, missed}, "the batch of new tasks took the fast path")

	// Another store commits version 1 of two tasks; this one has no head
	// of them and predicts them new.
	theirs := ev(l, "elsewhere", 1, "step")
	require.Equal(t, wire.VerdictCommitted, appendOne(t, other, theirs).Verdict)
	ours := ev(l, "elsewhere", 1, "step")
	ours.Payload = []byte(`{"other":true}`)
	require.Equal(t, wire.VerdictConflict, appendOne(t, s, ours).Verdict, "version 1 is taken, by other content")
	resent := ev(l, "elsewhere-2", 1, "step")
	require.Equal(t, wire.VerdictCommitted, appendOne(t, other, resent).Verdict)
	require.Equal(t, wire.VerdictDuplicate, appendOne(t, s, resent).Verdict, "the same event again")
	fast, missed = s.FastPath()
	require.Equal(t, []int64{3, 2}, []int64{fast, missed}, "both predictions missed")
	for _, task := range []string{"elsewhere", "elsewhere-2"} {
		require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE task_id = $1`, task), task)
		require.Equal(t, 1, countRows(t, db, `SELECT version FROM ledger.heads WHERE task_id = $1`, task), task)
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
	b, err := other.TakeOver(ctx, 5, "worker-a.2", a.Generation, longTTL)
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

// The fast path decides as the careful path does. Two ledgers get the same
// random batches of what workers send: next versions, copies of earlier
// events (committed or rejected), other content under a used id or version,
// versions ahead (some with their gap window closed), and a zombie's
// events after a takeover. One store may predict, the other always reads
// first; every event must get the same verdict, and the two ledgers must
// end with the same rows in the same order (not at the same seqs: an insert
// the fast path's checks roll back burns its seqs, as docs/contract.md §7
// allows).
func TestFastPathDecidesAsTheCarefulPath(t *testing.T) {
	t.Parallel()
	cfg := fence.Config{MaxAhead: 8}
	fast, dbF := newStore(t, cfg)
	slow, dbC := newStore(t, cfg)
	careful := fence.WithoutFastPath(slow)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(15, 2026))

	const partitions, tasks = 2, 6
	holders := []string{"worker-a.1", "worker-b.1"}
	var cur [partitions]fence.Lease // the partition's holder now
	var prev [partitions]fence.Lease
	for p := range partitions {
		l, err := fast.Acquire(ctx, p, holders[0], longTTL)
		require.NoError(t, err)
		l2, err := careful.Acquire(ctx, p, holders[0], longTTL)
		require.NoError(t, err)
		require.Equal(t, l.Generation, l2.Generation)
		cur[p], prev[p] = l, l
	}
	heads := map[string]int64{}
	var history []fence.Event
	mint := func(l fence.Lease, task string, v int64) fence.Event {
		return fence.Event{ID: newID(), Partition: l.Partition, Task: task, Version: v, Type: "step",
			Payload: []byte(fmt.Sprintf(`{"v":%d,"r":%d}`, v, rng.IntN(3))), Holder: l.Holder, Generation: l.Generation}
	}
	for round := range 160 {
		zombie := -1
		if round%17 == 16 { // a takeover: the old holder becomes a zombie
			p := rng.IntN(partitions)
			zombie = p
			next := holders[(slices.Index(holders, cur[p].Holder)+1)%len(holders)]
			expire(t, dbF, p)
			expire(t, dbC, p)
			l, err := fast.TakeOver(ctx, p, next, cur[p].Generation, longTTL)
			require.NoError(t, err)
			l2, err := careful.TakeOver(ctx, p, next, cur[p].Generation, longTTL)
			require.NoError(t, err)
			require.Equal(t, l.Generation, l2.Generation)
			prev[p], cur[p] = cur[p], l
		}
		var batch []fence.Event
		clean := round%2 == 0        // mostly next versions, as a worker sends: what the fast path predicts
		planned := maps.Clone(heads) // the next versions this batch gives out
		size := 1 + rng.IntN(10)
		if zombie >= 0 {
			// The zombie's next versions alone, as the fast store last
			// saw its lease: predicted to commit, refused by the fence.
			for k := zombie; k < tasks && len(batch) < 3; k += partitions {
				task := fmt.Sprintf("task-%d", k)
				batch = append(batch, mint(prev[zombie], task, heads[task]+1))
			}
			size = 0
		}
		for range size {
			k := rng.IntN(tasks)
			task, p := fmt.Sprintf("task-%d", k), k%partitions
			var e fence.Event
			switch n := rng.IntN(20); {
			case clean && n < 2 && resentable(history, planned, cur) >= 0:
				// an earlier event that did not commit (ahead then, judged
				// gap, or waiting), sent again now that it is next
				e = history[resentable(history, planned, cur)]
				planned[e.Task] = e.Version
			case clean && n == 2: // the zombie's next version
				e = mint(prev[p], task, planned[task]+1)
			case clean || n < 11 || len(history) == 0: // the next version
				e = mint(cur[p], task, planned[task]+1)
				planned[task]++
			case n < 14: // a copy of an earlier event, whatever became of it
				e = history[rng.IntN(len(history))]
			case n < 15: // an earlier id, other content
				e = history[rng.IntN(len(history))]
				e.Payload = []byte(`{"other":true}`)
			case n < 16: // a version already taken, other content
				e = mint(cur[p], task, max(heads[task], 1))
			case n < 18: // ahead, sometimes with its window closed
				e = mint(cur[p], task, heads[task]+2+int64(rng.IntN(10)))
				e.Final = rng.IntN(2) == 0
			default: // the zombie's next version
				e = mint(prev[p], task, heads[task]+1)
			}
			batch = append(batch, e)
		}
		history = append(history, batch...)
		got, err := fast.Append(ctx, batch)
		require.NoError(t, err)
		want, err := careful.Append(ctx, batch)
		require.NoError(t, err)
		for i := range batch {
			g, w := got[i], want[i]
			require.Equal(t, []any{w.Verdict, w.Reason, w.Repeat, w.Seq > 0, w.CurrentGeneration},
				[]any{g.Verdict, g.Reason, g.Repeat, g.Seq > 0, g.CurrentGeneration},
				"round %d, event %d (%s v%d by %s/%d)", round, i, batch[i].Task, batch[i].Version, batch[i].Holder, batch[i].Generation)
			if w.Verdict == wire.VerdictCommitted {
				heads[batch[i].Task] = max(heads[batch[i].Task], batch[i].Version)
			}
		}
	}
	for _, q := range []string{
		`SELECT string_agg(concat_ws(' ', event_id, task_id, version, holder, generation), ',' ORDER BY seq) FROM ledger.events`,
		`SELECT string_agg(concat_ws(' ', event_id, verdict, reason), ',' ORDER BY id) FROM ledger.rejections`,
		`SELECT string_agg(concat_ws(' ', task_id, partition, version, type), ',' ORDER BY task_id) FROM ledger.heads`,
	} {
		var a, b string
		require.NoError(t, dbF.Pool.QueryRow(ctx, q).Scan(&a))
		require.NoError(t, dbC.Pool.QueryRow(ctx, q).Scan(&b))
		require.Equal(t, b, a, q)
	}
	attempts, missed := fast.FastPath()
	t.Logf("fast path: %d attempts, %d missed", attempts, missed)
	require.Positive(t, attempts, "the workload took the fast path")
	require.Positive(t, missed, "and missed with it")
}

// resentable is the position in history of an event by a current holder
// whose version is now its task's next, or -1.
func resentable(history []fence.Event, next map[string]int64, cur [2]fence.Lease) int {
	for i, e := range history {
		l := cur[e.Partition]
		if e.Version == next[e.Task]+1 && e.Holder == l.Holder && e.Generation == l.Generation {
			return i
		}
	}
	return -1
}
