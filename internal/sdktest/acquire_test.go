package sdktest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/worker"
)

const retryLog = "acquire not answered"

type acquired struct {
	lease *worker.Lease
	err   error
}

func acquireAsync(ctx context.Context, c *worker.Client, partition int) <-chan acquired {
	done := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(ctx, partition)
		done <- acquired{l, err}
	}()
	return done
}

func wait(t *testing.T, done <-chan acquired) *worker.Lease {
	t.Helper()
	select {
	case r := <-done:
		require.NoError(t, r.err)
		return r.lease
	case <-time.After(15 * time.Second):
		t.Fatal("acquire did not return")
		return nil
	}
}

// leasedOnce makes partition's lease row exist, so a test can lock it: a
// first holder comes and releases. It returns that generation.
func (l *ledger) leasedOnce(ctx context.Context, partition int) int64 {
	l.t.Helper()
	first := l.client(nil, worker.Config{Holder: "worker-b.1"})
	lease, err := first.Acquire(ctx, partition)
	require.NoError(l.t, err)
	require.NoError(l.t, lease.Release(ctx))
	return lease.Generation()
}

// The bug: an acquire that timed out while the service was slow
// (here: its database waits for the lease row, which the test holds locked,
// as an overloaded batch would), and was then granted, followed by the
// SDK's retry, bumped the generation twice; and the fresh lease was lost at
// its first renewal, because its local deadline counted from the slow
// request. Now the retries carry the request's id, so the service grants
// once, and a grant that leaves little of its deadline is renewed at once.
//
// Not parallel: it holds a lease row for seconds.
func TestAcquireThatTimedOutAndWasSentAgainIsGrantedOnceAndKept(t *testing.T) {
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	const partition, ttl = 5, 3 * time.Second
	before := l.leasedOnce(ctx, partition)

	rec := &recorder{}
	a := l.client(nil, worker.Config{Holder: "worker-a.1", TTL: ttl, RequestTimeout: 250 * time.Millisecond,
		Logger: slog.New(rec)})
	tx := l.lockLease(ctx, partition)

	start := time.Now()
	done := acquireAsync(ctx, a, partition)
	// Nine sends time out while the row is held: the grant comes some
	// 2.3 s after the first send, when less of its local deadline is left
	// (0.6 s) than the renewal interval (1 s).
	require.Eventually(t, func() bool { return rec.count(retryLog, start) >= 9 }, 20*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Rollback(ctx))
	lease := wait(t, done)

	require.Equal(t, before+1, lease.Generation(), "the retries were granted again")
	require.Equal(t, 1, l.count(`SELECT count(*) FROM ledger.lease_grants WHERE partition = $1 AND holder = 'worker-a.1'`, partition))
	require.False(t, lease.Deadline().Round(0).After(lease.ExpiresAt()),
		"local deadline %v is after the database's expiry %v", lease.Deadline(), lease.ExpiresAt())

	// Kept through two TTLs: its renewals went through.
	select {
	case <-lease.Lost():
		t.Fatalf("the late grant was lost: %v\nthe client's log:\n%s", context.Cause(lease.Context()), rec)
	case <-time.After(2 * ttl):
	}
	got := leaseGet(t, l.ns.Conn(t), partition)
	require.True(t, *got.Valid)
	require.Equal(t, lease.Generation(), got.Generation)
}

// A grant whose reply was lost: the request reached the service (which
// waited for the lease row, held by the test), then the worker's network
// was cut, the grant was made and its reply went nowhere, and the worker
// sent the request again after the grant. The local deadline must count
// from the first send, the only one known to precede the grant; counted
// from the send that got the answer, it would fall after the database's
// expiry, and the worker would trust a lease another could already take.
//
// Not parallel: it compares clock readings to tens of milliseconds.
func TestGrantWhoseReplyWasLostCountsItsDeadlineFromTheFirstSend(t *testing.T) {
	l := newLedger(t)
	ctx := testCtx(t, 30*time.Second)
	const partition, ttl = 6, 2 * time.Second
	before := l.leasedOnce(ctx, partition)

	proxy, nc := l.proxiedConn("worker-a.1")
	rec := &recorder{}
	a := newClient(t, nc, worker.Config{Holder: "worker-a.1", TTL: ttl, RequestTimeout: 300 * time.Millisecond,
		Logger: slog.New(rec)})

	tx := l.lockLease(ctx, partition)
	done := acquireAsync(ctx, a, partition)
	require.Eventually(t, func() bool {
		return l.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	}, 10*time.Second, 2*time.Millisecond, "the acquire never reached the database")

	proxy.Cut()
	require.NoError(t, tx.Rollback(ctx))
	var grantedAt time.Time
	require.Eventually(t, func() bool {
		return l.db.Pool.QueryRow(ctx, `SELECT granted_at FROM ledger.lease_grants WHERE partition = $1 AND holder = 'worker-a.1'`,
			partition).Scan(&grantedAt) == nil
	}, 10*time.Second, 5*time.Millisecond)
	// The send that will be answered leaves well after the grant.
	require.Eventually(t, func() bool { return rec.count(retryLog, grantedAt.Add(150*time.Millisecond)) > 0 },
		10*time.Second, 5*time.Millisecond)
	proxy.Restore()
	lease := wait(t, done)

	require.Equal(t, before+1, lease.Generation())
	require.Equal(t, 1, l.count(`SELECT count(*) FROM ledger.lease_grants WHERE partition = $1 AND holder = 'worker-a.1'`, partition))
	require.False(t, lease.Deadline().Round(0).After(lease.ExpiresAt()),
		"local deadline %v is after the database's expiry %v", lease.Deadline().Round(0), lease.ExpiresAt())
}
