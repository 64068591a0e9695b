package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// The commit-order race (doc.go, Fence and Commit order; docs/contract.md §8): many appenders
// take partitions over from each other on short TTLs, keep appending with
// their old generation for a while after they lost it (zombies), and a
// checker that sees only the recorded call intervals and the tables asserts
//
//   - no append whose call began after a takeover's acquire returned is
//     committed with an older generation of that partition, and
//   - every committed row carries the holder ledger.lease_grants shows for
//     its partition and generation.
//
// The negative control runs the same workload with the fence switched off
// (fence.Unfenced) and requires the checker to report violations.

const (
	raceAppenders  = 8
	racePartitions = 3
	raceTTL        = 100 * time.Millisecond // the minimum TTL
	// The workload runs until it has raceMinTakeovers takeovers,
	// raceMinZombies zombie appends, raceMinCommitted commits and
	// raceMinSuperseded superseded rejections, for at least raceMinRun and at most
	// raceMaxRun; every loop is bounded by raceMaxIter as well.
	raceMinTakeovers = 60
	raceMinZombies   = 40
	// A loaded machine slows commits, not takeovers: the run waits for
	// enough of both rather than for a fixed time.
	raceMinCommitted  = 200
	raceMinSuperseded = 10
	raceMinRun        = 1500 * time.Millisecond
	raceMaxRun        = 30 * time.Second
	raceMaxIter       = 20000
)

// raceCall is one Append call as its caller saw it.
type raceCall struct {
	start      time.Time // time.Now() just before Append was called
	holder     string
	partition  int
	generation int64
	zombie     bool // the caller had already noticed it lost the lease
	events     []fence.Event
	results    []fence.Result
	err        error
}

// raceAcquire is one successful Acquire or TakeOver.
type raceAcquire struct {
	partition  int
	generation int64
	holder     string
	returned   time.Time // time.Now() just after the call returned
}

// raceRow is a committed row of ledger.events.
type raceRow struct {
	seq        int64
	eventID    string
	partition  int
	generation int64
	holder     string
}

// raceGrant is a row of ledger.lease_grants.
type raceGrant struct {
	partition  int
	generation int64
	holder     string
}

type pg struct {
	partition  int
	generation int64
}

// checkCommitOrder is the race test's checker. It sees only what the
// workload recorded (when each Append call began and which events it
// carried, when each acquire returned) and the tables, and returns every
// violation of the fence it finds.
//
// The time comparisons are sound: both instants are time.Now() of this
// process (monotonic clock), and an acquire has committed its grant before
// it returns, so an Append call that began after it must see the new
// generation.
func checkCommitOrder(rows []raceRow, grants []raceGrant, calls []raceCall, acquires []raceAcquire) []string {
	var violations []string

	callOf := map[string]*raceCall{}
	for i := range calls {
		for _, e := range calls[i].events {
			callOf[e.ID] = &calls[i]
		}
	}
	holderOf := map[pg]string{}
	for _, g := range grants {
		holderOf[pg{g.partition, g.generation}] = g.holder
	}
	// firstNewer[p][g] is the earliest instant an acquire of a generation
	// above g on p returned.
	byPartition := map[int][]raceAcquire{}
	for _, a := range acquires {
		byPartition[a.partition] = append(byPartition[a.partition], a)
	}
	firstNewer := func(p int, g int64) (time.Time, *raceAcquire) {
		var best *raceAcquire
		for i, a := range byPartition[p] {
			if a.generation > g && (best == nil || a.returned.Before(best.returned)) {
				best = &byPartition[p][i]
			}
		}
		if best == nil {
			return time.Time{}, nil
		}
		return best.returned, best
	}

	for _, r := range rows {
		h, ok := holderOf[pg{r.partition, r.generation}]
		switch {
		case !ok:
			violations = append(violations, fmt.Sprintf(
				"seq %d (event %s): partition %d generation %d was never granted", r.seq, r.eventID, r.partition, r.generation))
		case h != r.holder:
			violations = append(violations, fmt.Sprintf(
				"seq %d (event %s): holder %s, but partition %d generation %d was granted to %s",
				r.seq, r.eventID, r.holder, r.partition, r.generation, h))
		}
		c := callOf[r.eventID]
		if c == nil {
			violations = append(violations, fmt.Sprintf("seq %d: event %s was not sent by any recorded call", r.seq, r.eventID))
			continue
		}
		if at, a := firstNewer(r.partition, r.generation); a != nil && c.start.After(at) {
			violations = append(violations, fmt.Sprintf(
				"seq %d (event %s): committed with generation %d of partition %d by a call that began %v after %s's acquire of generation %d returned",
				r.seq, r.eventID, r.generation, r.partition, c.start.Sub(at), a.holder, a.generation))
		}
	}
	return violations
}

// zombieCallsAfterTakeover counts the Append calls that began after an
// acquire of a newer generation of their partition had returned: the calls
// the fence must refuse.
func zombieCallsAfterTakeover(calls []raceCall, acquires []raceAcquire) int {
	n := 0
	for _, c := range calls {
		for _, a := range acquires {
			if a.partition == c.partition && a.generation > c.generation && c.start.After(a.returned) {
				n++
				break
			}
		}
	}
	return n
}

type raceWorkload struct {
	leases  *fence.Store // lease calls, TaskHead
	appends *fence.Store // Append: fenced, or the unfenced control
	pool    *pgxpool.Pool
	seed    uint64
	// minSuperseded is how many superseded rejections the run waits for:
	// the unfenced control has none to wait for.
	minSuperseded int64

	stop       atomic.Bool
	takeovers  atomic.Int64
	zombies    atomic.Int64
	committed  atomic.Int64
	superseded atomic.Int64
}

type raceResult struct {
	calls    []raceCall
	acquires []raceAcquire
	errs     []error // unexpected errors of lease calls and TaskHead
}

type raceWorker struct {
	w      *raceWorkload
	id     int
	holder string
	rng    *rand.Rand

	lease      *fence.Lease
	zombieLeft int // < 0: not yet noticed the loss
	next       map[string]int64

	out raceResult
}

func (w *raceWorker) tasks(p int) []string {
	return []string{
		fmt.Sprintf("w%d-p%d-a", w.id, p),
		fmt.Sprintf("w%d-p%d-b", w.id, p),
		fmt.Sprintf("shared-p%d", p), // every holder of p writes it
	}
}

func (w *raceWorker) refreshHead(ctx context.Context, task string) {
	h, err := w.w.leases.TaskHead(ctx, task)
	if err != nil {
		w.out.errs = append(w.out.errs, err)
		return
	}
	w.next[task] = h.Version + 1
}

func (w *raceWorker) acquire(ctx context.Context) {
	p := w.rng.IntN(racePartitions)
	var observed int64
	cur, err := w.w.leases.Get(ctx, p)
	switch {
	case errors.Is(err, fence.ErrNoLease):
	case err != nil:
		w.out.errs = append(w.out.errs, err)
		return
	case cur.Valid:
		time.Sleep(time.Duration(w.rng.IntN(1000)) * time.Microsecond)
		return
	default:
		observed = cur.Generation
	}
	var l fence.Lease
	if w.rng.IntN(2) == 0 {
		l, err = w.w.leases.TakeOver(ctx, p, w.holder, observed, raceTTL)
	} else {
		l, err = w.w.leases.Acquire(ctx, p, w.holder, raceTTL)
	}
	returned := time.Now()
	if errors.Is(err, fence.ErrHeld) || errors.Is(err, fence.ErrObservationStale) {
		return
	}
	if err != nil {
		w.out.errs = append(w.out.errs, err)
		return
	}
	w.out.acquires = append(w.out.acquires, raceAcquire{partition: p, generation: l.Generation, holder: w.holder, returned: returned})
	if l.Generation > 1 {
		w.w.takeovers.Add(1)
	}
	w.lease, w.zombieLeft = &l, -1
	for _, task := range w.tasks(p) {
		w.refreshHead(ctx, task)
	}
}

func (w *raceWorker) appendBatch(ctx context.Context) {
	l := w.lease
	tasks := w.tasks(l.Partition)
	n := 1 + w.rng.IntN(4)
	events := make([]fence.Event, 0, n)
	planned := map[string]int64{}
	for range n {
		task := tasks[w.rng.IntN(len(tasks))]
		v, ok := planned[task]
		if !ok {
			v = w.next[task]
		}
		planned[task] = v + 1
		e := ev(*l, task, v, "step")
		events = append(events, e)
	}
	c := raceCall{start: time.Now(), holder: w.holder, partition: l.Partition, generation: l.Generation,
		zombie: w.zombieLeft >= 0, events: events}
	if c.zombie {
		w.w.zombies.Add(1)
	}
	c.results, c.err = w.w.appends.Append(ctx, events)
	w.out.calls = append(w.out.calls, c)

	stale := false
	refresh := map[string]bool{}
	for i, e := range events {
		if c.err != nil || c.results[i].Verdict != wire.VerdictCommitted {
			refresh[e.Task] = true
		}
		if c.err == nil && c.results[i].Verdict == wire.VerdictStale {
			stale = true
		}
		if c.err == nil && c.results[i].Verdict == wire.VerdictCommitted {
			w.w.committed.Add(1)
		}
		if c.err == nil && c.results[i].Verdict == wire.VerdictStale && c.results[i].Reason == wire.ReasonSuperseded {
			w.w.superseded.Add(1)
		}
		if c.err == nil && c.results[i].Verdict == wire.VerdictCommitted && e.Version >= w.next[e.Task] {
			w.next[e.Task] = e.Version + 1
		}
	}
	for task := range refresh {
		w.refreshHead(ctx, task)
	}

	switch {
	case w.zombieLeft >= 0:
		// A zombie keeps going with its old generation for a few batches.
		w.zombieLeft--
		if w.zombieLeft < 0 {
			w.lease = nil
		}
		return
	case stale:
		w.zombieLeft = 1 + w.rng.IntN(4)
		return
	}
	if w.rng.IntN(25) == 0 {
		// A pause (GC, a slow disk): the lease may run out meanwhile.
		time.Sleep(time.Duration(50+w.rng.IntN(100)) * time.Millisecond)
	}
	if _, err := w.w.leases.Renew(ctx, l.Partition, w.holder, l.Generation, 0); err != nil {
		if !errors.Is(err, fence.ErrLost) {
			w.out.errs = append(w.out.errs, err)
		}
		w.zombieLeft = 1 + w.rng.IntN(4)
	}
}

func (w *raceWorker) run(ctx context.Context) {
	for iter := 0; iter < raceMaxIter && !w.w.stop.Load(); iter++ {
		if w.lease == nil {
			w.acquire(ctx)
			continue
		}
		w.appendBatch(ctx)
		time.Sleep(time.Duration(w.rng.IntN(1500)) * time.Microsecond)
	}
}

// expirer makes a random partition's lease expire now and then, as if its
// holder had stalled: that is what drives the takeovers.
func (w *raceWorkload) expirer(ctx context.Context, rng *rand.Rand) error {
	for iter := 0; iter < raceMaxIter && !w.stop.Load(); iter++ {
		time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond)
		_, err := w.pool.Exec(ctx, ledgertest.ExpireLeaseSQL, rng.IntN(racePartitions))
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *raceWorkload) run(t *testing.T) raceResult {
	ctx, cancel := context.WithTimeout(context.Background(), raceMaxRun+20*time.Second)
	defer cancel()
	workers := make([]*raceWorker, raceAppenders)
	var wg sync.WaitGroup
	for i := range workers {
		workers[i] = &raceWorker{w: w, id: i, holder: fmt.Sprintf("w.%d", i),
			rng: rand.New(rand.NewPCG(w.seed, uint64(i))), next: map[string]int64{}}
		wg.Go(func() { workers[i].run(ctx) })
	}
	var expErr error
	wg.Go(func() { expErr = w.expirer(ctx, rand.New(rand.NewPCG(w.seed, 1000))) })

	start := time.Now()
	for {
		time.Sleep(20 * time.Millisecond)
		el := time.Since(start)
		enough := w.takeovers.Load() >= raceMinTakeovers && w.zombies.Load() >= raceMinZombies &&
			w.committed.Load() >= raceMinCommitted && w.superseded.Load() >= w.minSuperseded
		if el >= raceMaxRun || (el >= raceMinRun && enough) {
			break
		}
	}
	w.stop.Store(true)
	wg.Wait()
	require.NoError(t, expErr)
	t.Logf("workload ran %v", time.Since(start).Round(time.Millisecond))

	var out raceResult
	for _, wk := range workers {
		out.calls = append(out.calls, wk.out.calls...)
		out.acquires = append(out.acquires, wk.out.acquires...)
		out.errs = append(out.errs, wk.out.errs...)
	}
	return out
}

func readRaceTables(t *testing.T, pool *pgxpool.Pool) ([]raceRow, []raceGrant) {
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT seq, event_id, partition, generation, holder FROM ledger.events ORDER BY seq`)
	require.NoError(t, err)
	var events []raceRow
	for rows.Next() {
		var r raceRow
		require.NoError(t, rows.Scan(&r.seq, &r.eventID, &r.partition, &r.generation, &r.holder))
		events = append(events, r)
	}
	require.NoError(t, rows.Err())

	rows, err = pool.Query(ctx, `SELECT partition, generation, holder FROM ledger.lease_grants ORDER BY partition, generation`)
	require.NoError(t, err)
	var grants []raceGrant
	for rows.Next() {
		var g raceGrant
		require.NoError(t, rows.Scan(&g.partition, &g.generation, &g.holder))
		grants = append(grants, g)
	}
	require.NoError(t, rows.Err())
	return events, grants
}

// raceStore is a store on its own database with a pool large enough that
// every appender has a connection of its own.
func raceStore(t *testing.T) (*fence.Store, *pgxpool.Pool) {
	db := dbtest.New(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = raceAppenders + 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := fence.New(pool, fence.Config{Partitions: racePartitions, TTL: raceTTL})
	require.NoError(t, err)
	return s, pool
}

type raceSummary struct {
	rows, grants, takeovers, calls, zombieCalls, violations int
	verdicts                                                map[string]int
}

func runRace(t *testing.T, unfenced bool) (raceSummary, []string) {
	s, pool := raceStore(t)
	w := &raceWorkload{leases: s, appends: s, pool: pool, seed: rand.Uint64(), minSuperseded: raceMinSuperseded}
	if unfenced {
		w.appends, w.minSuperseded = fence.Unfenced(s), 0
	}
	t.Logf("seed %d", w.seed)
	res := w.run(t)
	require.Empty(t, res.errs, "unexpected errors of lease calls")

	rows, grants := readRaceTables(t, pool)
	violations := checkCommitOrder(rows, grants, res.calls, res.acquires)

	sum := raceSummary{rows: len(rows), grants: len(grants), calls: len(res.calls),
		zombieCalls: zombieCallsAfterTakeover(res.calls, res.acquires), violations: len(violations),
		verdicts: map[string]int{}}
	for _, g := range grants {
		if g.generation > 1 {
			sum.takeovers++
		}
	}

	// The recording is complete: every grant in the table is an acquire the
	// workload saw return, so the checker compared against all of them.
	recorded := make([]raceGrant, 0, len(res.acquires))
	for _, a := range res.acquires {
		recorded = append(recorded, raceGrant{a.partition, a.generation, a.holder})
	}
	sort.Slice(recorded, func(i, j int) bool {
		if recorded[i].partition != recorded[j].partition {
			return recorded[i].partition < recorded[j].partition
		}
		return recorded[i].generation < recorded[j].generation
	})
	require.Equal(t, grants, recorded, "ledger.lease_grants differs from the acquires the workload recorded")

	// Results agree with the table: committed events are there with their
	// seq, nothing else is.
	seqOf := map[string]int64{}
	for _, r := range rows {
		seqOf[r.eventID] = r.seq
	}
	failed := 0
	for _, c := range res.calls {
		if c.err != nil {
			failed++
			continue
		}
		for i, e := range c.events {
			r := c.results[i]
			key := string(r.Verdict)
			if r.Reason != "" {
				key += "/" + r.Reason
			}
			sum.verdicts[key]++
			seq, ok := seqOf[e.ID]
			if r.Verdict == wire.VerdictCommitted {
				require.True(t, ok, "event %s was reported committed but is not in ledger.events", e.ID)
				require.Equal(t, r.Seq, seq)
			} else {
				require.False(t, ok, "event %s was reported %s/%s but is in ledger.events", e.ID, r.Verdict, r.Reason)
			}
		}
	}
	if !unfenced {
		require.Zero(t, failed, "Append calls of the fenced run failed")
	}
	var rejected, recordedRejections int
	for k, n := range sum.verdicts {
		if strings.HasPrefix(k, "stale/") || strings.HasPrefix(k, "conflict/") || strings.HasPrefix(k, "gap/") {
			rejected += n
		}
	}
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger.rejections`).Scan(&recordedRejections))
	if failed == 0 {
		require.Equal(t, rejected, recordedRejections, "ledger.rejections differs from the rejected results")
	}
	t.Logf("rows %d, grants %d (takeovers %d), calls %d (%d failed), zombie calls after a takeover %d, violations %d, verdicts %v",
		sum.rows, sum.grants, sum.takeovers, sum.calls, failed, sum.zombieCalls, sum.violations, sum.verdicts)

	// The workload did what the test needs, or it proves nothing.
	require.GreaterOrEqual(t, sum.takeovers, 50, "too few takeovers")
	require.GreaterOrEqual(t, sum.zombieCalls, 10, "too few appends began after their generation was taken over")
	return sum, violations
}

func TestCommitOrderRace(t *testing.T) {
	t.Parallel()

	t.Run("fenced", func(t *testing.T) {
		t.Parallel()
		sum, violations := runRace(t, false)
		require.Empty(t, violations, "the fence let stale writes commit")
		require.GreaterOrEqual(t, sum.rows, raceMinCommitted, "too few committed rows")
		stale := sum.verdicts["stale/superseded"] + sum.verdicts["stale/not_holder"] + sum.verdicts["stale/lease_expired"]
		require.GreaterOrEqual(t, stale, 50, "too few stale rejections")
		require.GreaterOrEqual(t, sum.verdicts["stale/superseded"], raceMinSuperseded, "too few superseded rejections")
	})

	// The negative control: the same workload without the fence must make the
	// checker report violations, or the checker could not fail.
	t.Run("unfenced_control", func(t *testing.T) {
		t.Parallel()
		sum, violations := runRace(t, true)
		require.NotEmpty(t, violations, "the checker found nothing with the fence off")
		t.Logf("the checker reported %d violations with the fence off, e.g. %s", len(violations), violations[0])
		require.Zero(t, sum.verdicts["stale/superseded"]+sum.verdicts["stale/not_holder"]+sum.verdicts["stale/lease_expired"])
	})
}

// TestCommitOrderRaceChecker feeds the checker hand-made histories, so each
// of its rules is seen to fail on its own.
func TestCommitOrderRaceChecker(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	acquires := []raceAcquire{
		{partition: 0, generation: 1, holder: "a", returned: at(0)},
		{partition: 0, generation: 2, holder: "b", returned: at(10)},
		{partition: 1, generation: 1, holder: "a", returned: at(5)},
	}
	grants := []raceGrant{{0, 1, "a"}, {0, 2, "b"}, {1, 1, "a"}}
	call := func(id string, start int, p int, holder string, g int64) raceCall {
		return raceCall{start: at(start), holder: holder, partition: p, generation: g, events: []fence.Event{{ID: id}}}
	}
	calls := []raceCall{
		call("before", 9, 0, "a", 1),      // began before b's acquire returned: may commit
		call("after", 11, 0, "a", 1),      // began after it: must not
		call("new", 12, 0, "b", 2),        // the new holder
		call("other", 50, 1, "a", 1),      // another partition's takeover does not matter
		call("wrongholder", 1, 0, "b", 1), // b never held generation 1
		call("ungranted", 1, 1, "a", 2),   // generation 2 of partition 1 was never granted
	}
	rows := []raceRow{
		{1, "before", 0, 1, "a"},
		{2, "new", 0, 2, "b"},
		{3, "other", 1, 1, "a"},
	}
	require.Empty(t, checkCommitOrder(rows, grants, calls, acquires))

	for _, tc := range []struct {
		row  raceRow
		want string
	}{
		{raceRow{4, "after", 0, 1, "a"}, "began 1ms after b's acquire of generation 2 returned"},
		{raceRow{4, "wrongholder", 0, 1, "b"}, "holder b, but partition 0 generation 1 was granted to a"},
		{raceRow{4, "ungranted", 1, 2, "a"}, "partition 1 generation 2 was never granted"},
		{raceRow{4, "unknown", 1, 1, "a"}, "event unknown was not sent by any recorded call"},
	} {
		v := checkCommitOrder(append(slices.Clone(rows), tc.row), grants, calls, acquires)
		require.Len(t, v, 1, tc.row.eventID)
		require.Contains(t, v[0], tc.want)
	}
}
