package fence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

const expireClaimSQL = `UPDATE ledger.ingest_claims SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE partition = $1`

// An ingest that was paused while another took its partition over wakes up
// with a batch in hand: it commits nothing and records nothing for the
// partition it lost, on the fast path and the careful one alike, and the
// new owner decides the same events as if the first had never been.
func TestIngestThatLostItsClaimCommitsNothing(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	a, ok, err := s.ClaimPartition(ctx, 3, "ingest-a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(1), a.Epoch)
	asA := &fence.Claims{Owner: "ingest-a", Epochs: map[int]int64{3: a.Epoch}}
	l, err := s.Acquire(ctx, 3, "w.1", time.Minute)
	require.NoError(t, err)

	res, err := s.AppendClaimed(ctx, asA, []fence.Event{ev(l, "t", 1, "step")})
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[0].Verdict)

	_, err = db.Pool.Exec(ctx, expireClaimSQL, 3)
	require.NoError(t, err)
	b, ok, err := s.ClaimPartition(ctx, 3, "ingest-b", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(2), b.Epoch)

	// The next version (fast path: head cached, lease as last
	// read) and a stale event (careful path, records a rejection).
	v2 := ev(l, "t", 2, "step")
	stale := v2
	stale.ID, stale.Task, stale.Generation = newID(), "u", l.Generation+5
	for _, batch := range [][]fence.Event{{v2}, {stale}} {
		_, err = s.AppendClaimed(ctx, asA, batch)
		require.ErrorIs(t, err, fence.ErrNotClaimed)
	}
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.events`))
	require.Zero(t, countRows(t, db, `SELECT count(*) FROM ledger.rejections`))

	asB := &fence.Claims{Owner: "ingest-b", Epochs: map[int]int64{3: b.Epoch}}
	res, err = s.AppendClaimed(ctx, asB, []fence.Event{v2, stale})
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[0].Verdict)
	require.Equal(t, wire.VerdictStale, res[1].Verdict)
}

// The same with the claim check switched off: the ingest that lost the
// partition commits, which is what the check prevents.
func TestWithoutTheClaimCheckALostIngestCommits(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	a, _, err := s.ClaimPartition(ctx, 3, "ingest-a", time.Minute)
	require.NoError(t, err)
	l, err := s.Acquire(ctx, 3, "w.1", time.Minute)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, expireClaimSQL, 3)
	require.NoError(t, err)
	_, _, err = s.ClaimPartition(ctx, 3, "ingest-b", time.Minute)
	require.NoError(t, err)
	asA := &fence.Claims{Owner: "ingest-a", Epochs: map[int]int64{3: a.Epoch}}
	res, err := fence.WithoutClaimCheck(s).AppendClaimed(ctx, asA, []fence.Event{ev(l, "t", 1, "step")})
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[0].Verdict, "the negative control must show the commit the check refuses")
}

// A takeover of a claim waits for the append made under it: in commit
// order, everything the old owner decided precedes the new owner's claim.
func TestClaimTakeoverWaitsForTheAppendInFlight(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{HeadCacheSize: -1})
	ctx := context.Background()
	a, _, err := s.ClaimPartition(ctx, 3, "ingest-a", time.Minute)
	require.NoError(t, err)
	l, err := s.Acquire(ctx, 3, "w.1", time.Minute)
	require.NoError(t, err)
	inWrite, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	paused := fence.BeforeWrite(s, func() { close(inWrite); <-release })
	appended := make(chan error, 1)
	go func() {
		_, err := paused.AppendClaimed(ctx, &fence.Claims{Owner: "ingest-a", Epochs: map[int]int64{3: a.Epoch}},
			[]fence.Event{ev(l, "t", 1, "step")})
		appended <- err
	}()
	<-inWrite
	_, err = db.Pool.Exec(ctx, expireClaimSQL, 3)
	require.NoError(t, err)
	claimed := make(chan struct{})
	go func() {
		_, ok, err := s.ClaimPartition(ctx, 3, "ingest-b", time.Minute)
		if err == nil && ok {
			close(claimed)
		}
	}()
	require.True(t, waitDoneOrBlocked(t, db, claimed), "the takeover must wait for the append holding the claim")
	once.Do(func() { close(release) })
	require.NoError(t, <-appended)
	select {
	case <-claimed:
	case <-time.After(10 * time.Second):
		t.Fatal("the takeover never completed")
	}
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.events`))
}

// Heartbeats keep an ingest's claims, expired or not, and count the live
// ingests; a released claim is taken at once with its epoch raised.
func TestIngestHeartbeatAndRelease(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	v, err := s.IngestHeartbeat(ctx, "ingest-a", time.Minute, true, nil)
	require.NoError(t, err)
	require.Equal(t, 1, v.Members)
	a, ok, err := s.ClaimPartition(ctx, 1, "ingest-a", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, ok, err = s.ClaimPartition(ctx, 1, "ingest-b", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "a valid claim of another ingest is not taken")

	_, err = db.Pool.Exec(ctx, expireClaimSQL, 1)
	require.NoError(t, err)
	v, err = s.IngestHeartbeat(ctx, "ingest-a", time.Minute, true, []int{1})
	require.NoError(t, err)
	require.True(t, v.Claims[1].Valid, "a heartbeat renews an expired claim nobody took")
	_, err = s.IngestHeartbeat(ctx, "ingest-b", time.Minute, true, nil)
	require.NoError(t, err)
	v, err = s.IngestHeartbeat(ctx, "ingest-c", time.Minute, false, nil)
	require.NoError(t, err)
	require.Equal(t, 2, v.Members, "a heartbeat that does not renew does not join")

	require.NoError(t, s.ReleaseClaim(ctx, a))
	v, err = s.IngestHeartbeat(ctx, "ingest-a", time.Minute, true, []int{1})
	require.NoError(t, err)
	require.False(t, v.Claims[1].Valid, "a released claim is not renewed, even by a heartbeat that still names it")
	b, ok, err := s.ClaimPartition(ctx, 1, "ingest-b", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, a.Epoch+1, b.Epoch)
}

// A pool guarded against superseded primaries refuses to connect to a
// server on an older timeline than the newest the ledger wrote to, and
// learns a newer one from the servers it connects to.
func TestGuardedPoolRefusesAnOlderTimeline(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, fence.Config{})
	ctx := context.Background()
	for _, c := range []struct {
		newest int64
		ok     bool
	}{{0, true}, {1, true}, {2, false}} {
		g := &fence.PrimaryGuard{}
		g.Raise(c.newest)
		pc, err := pgxpool.ParseConfig(db.URL)
		require.NoError(t, err)
		fence.GuardPool(pc, g)
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		require.NoError(t, err)
		err = pool.Ping(ctx)
		pool.Close()
		if c.ok {
			require.NoError(t, err)
			require.Equal(t, int64(1), g.Newest(), "the guard learns the server's timeline")
			continue
		}
		require.ErrorIs(t, err, fence.ErrSupersededPrimary)
		require.ErrorContains(t, err, "timeline 1, but the ledger has written to timeline 2")
	}
}

// A store's pool that connected while its guard knew an older timeline
// (an ingest that started while an old primary was back, first in the
// connection string) drops those connections once the guard learns a
// newer one: the next statement connects anew, and is refused.
func TestGuardLearningANewerTimelineDropsThePoolsConnections(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, fence.Config{})
	ctx := context.Background()
	g := &fence.PrimaryGuard{}
	pc, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	fence.GuardPool(pc, g)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer pool.Close()
	_, err = fence.New(pool, fence.Config{Primary: g})
	require.NoError(t, err)
	require.NoError(t, pool.Ping(ctx))
	require.Equal(t, int64(1), g.Newest())

	g.Raise(2) // another ingest wrote to a promoted standby
	require.Eventually(t, func() bool {
		return errors.Is(pool.Ping(ctx), fence.ErrSupersededPrimary)
	}, 10*time.Second, 10*time.Millisecond, "a pooled connection to the old primary still served")
}
