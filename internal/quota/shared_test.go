package quota

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
)

// Two processes share one principal's quota: what they spend together
// stays within it, another principal's share is its own, the database's
// clock refills it, and a refused principal is refused locally for a
// second before the database is asked again.
func TestTwoProcessesShareOnePrincipalsQuota(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	now := time.Unix(1000, 0)
	a, b := NewShared(db.Pool, DeadLetters, 6400), NewShared(db.Pool, DeadLetters, 6400)
	a.now = func() time.Time { return now }
	b.now = a.now

	require.True(t, a.Take("billing", 4000))
	require.True(t, b.Take("billing", 2000))
	require.True(t, a.Take("billing", 100), "what the shared bucket has left")
	require.False(t, b.Take("billing", 500), "spent across both processes")
	require.False(t, a.Take("billing", 500), "spent across both processes")
	require.True(t, b.Take("reports", 6400), "another principal's share is its own")

	var left float64
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT bytes_left FROM ledger.quota_buckets WHERE kind = 'dead_letters' AND principal = 'billing'`).Scan(&left))
	require.Less(t, left, 500.0)

	// 36 minutes later by the database's clock: 3840 bytes back.
	_, err := db.Pool.Exec(context.Background(), `UPDATE ledger.quota_buckets SET at = at - interval '36 minutes'`)
	require.NoError(t, err)
	require.False(t, b.Take("billing", 3000), "refused a moment ago: not asked again yet")
	now = now.Add(sharedRetry)
	require.True(t, b.Take("billing", 3000))
	require.True(t, a.Take("billing", 500))
	require.False(t, b.Take("billing", 1000), "within a refill's bytes, not more")
}

// While the database does not answer, each process keeps a quota of its
// own rather than refuse every principal.
func TestSharedQuotaFallsBackToItsOwnWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	q := NewShared(db.Pool, Projections, 1000)
	db.Pool.Close()
	require.True(t, q.Take("billing", 1000))
	require.False(t, q.Take("billing", 1))
}

// A database that does not answer costs one timeout, not one a take: for
// a second after it the process's own bucket decides without asking.
// Switch: Take asking the database whatever unanswered says (every take
// then dials again, and waits its timeout).
func TestSilentDatabaseIsAskedOnceASecond(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var dials atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			defer c.Close() // silent: it never answers the startup message
		}
	}()
	pool, err := pgxpool.New(context.Background(), "postgres://u@"+ln.Addr().String()+"/db?sslmode=disable")
	require.NoError(t, err)
	defer pool.Close()

	q := NewShared(pool, DeadLetters, 1000)
	base := time.Now()
	q.now = func() time.Time { return base } // the second never ends
	for range 5 {
		require.True(t, q.Take("billing", 10), "the local bucket decides")
	}
	require.Equal(t, int64(1), dials.Load(), "one question to a database that does not answer")
}
