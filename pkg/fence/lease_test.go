package fence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
)

const longTTL = time.Minute

// The seed: B and C both observed the old generation 41 of an expired lease
// and race to take it over. Here sixteen takers race: exactly one wins.
func TestConcurrentTakeoverOfExpiredLeaseHasOneWinner(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()

	var l fence.Lease
	var err error
	for range 41 { // bring the partition to generation 41, held by worker A
		l, err = s.Acquire(ctx, 3, "worker-a.1", longTTL)
		require.NoError(t, err)
	}
	require.EqualValues(t, 41, l.Generation)
	expire(t, db, 3)

	observed, err := s.Get(ctx, 3)
	require.NoError(t, err)
	require.False(t, observed.Valid)
	require.EqualValues(t, 41, observed.Generation)

	const takers = 16
	var wg sync.WaitGroup
	start := make(chan struct{})
	wins := make(chan fence.Lease, takers)
	errs := make(chan error, takers)
	for i := range takers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got, err := s.TakeOver(ctx, 3, "worker-"+string(rune('b'+i))+".1", observed.Generation, longTTL)
			if err != nil {
				errs <- err
				return
			}
			wins <- got
		}()
	}
	close(start)
	wg.Wait()
	close(wins)
	close(errs)

	require.Len(t, wins, 1, "exactly one taker must win")
	winner := <-wins
	require.EqualValues(t, 42, winner.Generation, "the generation rises by exactly one")
	for err := range errs {
		require.ErrorIs(t, err, fence.ErrHeld, "a loser is told the lease is held")
		var le *fence.LeaseError
		require.True(t, errors.As(err, &le))
		require.NotNil(t, le.Current)
		require.Equal(t, winner.Holder, le.Current.Holder, "the error names the current holder")
		require.EqualValues(t, 42, le.Current.Generation)
	}
	cur, err := s.Get(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, winner.Holder, cur.Holder)
	require.EqualValues(t, 42, cur.Generation)
	require.Equal(t, 42, countRows(t, db, `SELECT count(*) FROM ledger.lease_grants WHERE partition = 3`))
}

func TestLeaseRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("never leased partition is granted generation 1", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t, fence.Config{})
		l, err := s.Acquire(ctx, 0, "worker-a.1", 0)
		require.NoError(t, err)
		require.EqualValues(t, 1, l.Generation)
		require.True(t, l.Valid)
		require.Equal(t, fence.TTLDefault, l.TTL, "default TTL is 3000 ms")
		require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.lease_grants WHERE partition = 0 AND generation = 1 AND holder = 'worker-a.1'`))
	})

	t.Run("valid lease is not stolen", func(t *testing.T) {
		t.Parallel()
		s, _ := newStore(t, fence.Config{})
		a, err := s.Acquire(ctx, 1, "worker-a.1", longTTL)
		require.NoError(t, err)
		_, err = s.Acquire(ctx, 1, "worker-b.1", longTTL)
		require.ErrorIs(t, err, fence.ErrHeld)
		cur, err := s.Get(ctx, 1)
		require.NoError(t, err)
		require.Equal(t, a.Holder, cur.Holder)
		require.Equal(t, a.Generation, cur.Generation)
	})

	t.Run("same holder re-acquiring fences its earlier incarnation", func(t *testing.T) {
		t.Parallel()
		s, _ := newStore(t, fence.Config{})
		first, err := s.Acquire(ctx, 1, "worker-a.1", longTTL)
		require.NoError(t, err)
		second, err := s.Acquire(ctx, 1, "worker-a.1", longTTL)
		require.NoError(t, err)
		require.Equal(t, first.Generation+1, second.Generation)
		_, err = s.Renew(ctx, 1, "worker-a.1", first.Generation, 0)
		require.ErrorIs(t, err, fence.ErrLost, "the earlier incarnation cannot renew")
	})

	t.Run("expired lease is taken over with the next generation", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t, fence.Config{})
		a, err := s.Acquire(ctx, 2, "worker-a.1", longTTL)
		require.NoError(t, err)
		expire(t, db, 2)
		b, err := s.Acquire(ctx, 2, "worker-b.1", longTTL)
		require.NoError(t, err)
		require.Equal(t, a.Generation+1, b.Generation)
		require.Equal(t, "worker-b.1", b.Holder)
	})

	t.Run("renew extends only the current holder and generation", func(t *testing.T) {
		t.Parallel()
		s, db := newStore(t, fence.Config{})
		a, err := s.Acquire(ctx, 4, "worker-a.1", time.Second)
		require.NoError(t, err)
		renewed, err := s.Renew(ctx, 4, "worker-a.1", a.Generation, 5*time.Second)
		require.NoError(t, err)
		require.True(t, renewed.ExpiresAt.After(a.ExpiresAt))
		require.Equal(t, 5*time.Second, renewed.TTL)
		require.Equal(t, a.Generation, renewed.Generation)

		_, err = s.Renew(ctx, 4, "worker-b.1", a.Generation, 0)
		require.ErrorIs(t, err, fence.ErrLost, "wrong holder")
		_, err = s.Renew(ctx, 4, "worker-a.1", a.Generation+1, 0)
		require.ErrorIs(t, err, fence.ErrLost, "wrong generation")
		expire(t, db, 4)
		_, err = s.Renew(ctx, 4, "worker-a.1", a.Generation, 0)
		require.ErrorIs(t, err, fence.ErrLost, "after expiry")
		var le *fence.LeaseError
		require.True(t, errors.As(err, &le))
		require.NotNil(t, le.Current)
		require.False(t, le.Current.Valid)
		require.Equal(t, "lost", le.Code())
	})

	t.Run("release needs the current holder and keeps the generation", func(t *testing.T) {
		t.Parallel()
		s, _ := newStore(t, fence.Config{})
		a, err := s.Acquire(ctx, 5, "worker-a.1", longTTL)
		require.NoError(t, err)
		require.ErrorIs(t, s.Release(ctx, 5, "worker-b.1", a.Generation), fence.ErrLost)
		require.ErrorIs(t, s.Release(ctx, 5, "worker-a.1", a.Generation+1), fence.ErrLost)
		require.NoError(t, s.Release(ctx, 5, "worker-a.1", a.Generation))
		require.ErrorIs(t, s.Release(ctx, 5, "worker-a.1", a.Generation), fence.ErrLost, "already released")

		cur, err := s.Get(ctx, 5)
		require.NoError(t, err)
		require.False(t, cur.Valid)
		require.Equal(t, a.Generation, cur.Generation, "a released lease keeps its generation")

		next, err := s.Acquire(ctx, 5, "worker-b.1", longTTL)
		require.NoError(t, err)
		require.Equal(t, a.Generation+1, next.Generation, "the next acquire bumps it")
	})

	t.Run("get of a never leased partition", func(t *testing.T) {
		t.Parallel()
		s, _ := newStore(t, fence.Config{})
		_, err := s.Get(ctx, 7)
		require.ErrorIs(t, err, fence.ErrNoLease)
	})

	t.Run("bad requests are invalid", func(t *testing.T) {
		t.Parallel()
		s, _ := newStore(t, fence.Config{})
		for name, call := range map[string]func() error{
			"partition below 0":   func() error { _, err := s.Acquire(ctx, -1, "w", 0); return err },
			"partition too large": func() error { _, err := s.Acquire(ctx, 16, "w.1", 0); return err },
			"bad holder":          func() error { _, err := s.Acquire(ctx, 0, "no spaces", 0); return err },
			"ttl too short":       func() error { _, err := s.Acquire(ctx, 0, "w.1", 99*time.Millisecond); return err },
			"ttl too long":        func() error { _, err := s.Acquire(ctx, 0, "w.1", 301*time.Second); return err },
			"renew ttl too long":  func() error { _, err := s.Renew(ctx, 0, "w", 1, time.Hour); return err },
			"get out of range":    func() error { _, err := s.Get(ctx, 99); return err },
		} {
			require.ErrorIs(t, call(), fence.ErrInvalid, name)
		}
	})
}

func TestLeaseExpiresByDatabaseClock(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, fence.Config{})
	ctx := context.Background()
	a, err := s.Acquire(ctx, 0, "worker-a.1", 100*time.Millisecond)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l, err := s.Get(ctx, 0)
		return err == nil && !l.Valid
	}, 5*time.Second, 20*time.Millisecond, "a 100 ms lease never expired")
	_, err = s.Renew(ctx, 0, "worker-a.1", a.Generation, 0)
	require.ErrorIs(t, err, fence.ErrLost)
}

// A retried acquire (its reply lost, or timed out and sent again) carries
// the request id of the grant that made the current generation: it gets
// that grant back, not a second bump. Any other acquire by the holder still
// fences its earlier incarnation.
func TestRetriedAcquireGetsTheSameGrant(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	first, err := s.Acquire(ctx, 4, "worker-a.1", longTTL, fence.WithRequestID("req-1"))
	require.NoError(t, err)
	again, err := s.Acquire(ctx, 4, "worker-a.1", longTTL, fence.WithRequestID("req-1"))
	require.NoError(t, err)
	require.Equal(t, first.Generation, again.Generation, "a retry is the same grant")
	require.Equal(t, first.ExpiresAt, again.ExpiresAt, "a retry is the same grant")

	other, err := s.Acquire(ctx, 4, "worker-a.1", longTTL, fence.WithRequestID("req-2"))
	require.NoError(t, err)
	require.Equal(t, first.Generation+1, other.Generation, "a new request fences the earlier incarnation")
	plain, err := s.Acquire(ctx, 4, "worker-a.1", longTTL)
	require.NoError(t, err)
	require.Equal(t, other.Generation+1, plain.Generation)
	stale, err := s.Acquire(ctx, 4, "worker-a.1", longTTL, fence.WithRequestID("req-2"))
	require.NoError(t, err)
	require.Equal(t, plain.Generation+1, stale.Generation, "only the current grant's id is a retry")

	_, err = s.Acquire(ctx, 4, "worker-b.1", longTTL, fence.WithRequestID("req-2"))
	require.ErrorIs(t, err, fence.ErrHeld, "another holder's id is no key to the lease")

	expire(t, db, 4)
	after, err := s.Acquire(ctx, 4, "worker-a.1", longTTL, fence.WithRequestID("req-2"))
	require.NoError(t, err)
	require.Equal(t, stale.Generation+1, after.Generation, "an expired grant is not returned")
	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.lease_grants WHERE partition = 4 AND request_id = 'req-1'`),
		"the retry wrote no second grant")
}

// The heads of many tasks come in one call, in the order asked, unknown
// tasks included.
func TestTaskHeadsOfManyTasksAtOnce(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, fence.Config{})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 2, "worker-a.1", longTTL)
	require.NoError(t, err)
	appendOne(t, s, ev(l, "a", 1, "start"))
	appendOne(t, s, ev(l, "a", 2, "done"))
	appendOne(t, s, ev(l, "c", 1, "start"))
	heads, err := s.TaskHeads(ctx, []string{"a", "b", "c"})
	require.NoError(t, err)
	require.Len(t, heads, 3)
	require.Equal(t, fence.Head{Task: "a", Known: true, Partition: 2, Version: 2, Seq: heads[0].Seq, Type: "done", Owner: "worker-a", Kind: "events"}, heads[0])
	require.Equal(t, fence.Head{Task: "b"}, heads[1])
	require.EqualValues(t, 1, heads[2].Version)
	_, err = s.TaskHeads(ctx, []string{"a", "bad id"})
	require.ErrorIs(t, err, fence.ErrInvalid)
}
