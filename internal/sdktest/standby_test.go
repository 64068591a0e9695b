package sdktest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

func acquireWaitAsync(ctx context.Context, c *worker.Client, partition int) <-chan acquired {
	done := make(chan acquired, 1)
	go func() {
		l, err := c.AcquireWait(ctx, partition)
		done <- acquired{l, err}
	}()
	return done
}

// grantedAt is when (by the database clock) partition's generation was
// granted.
func (l *ledger) grantedAt(ctx context.Context, partition int, generation int64) time.Time {
	l.t.Helper()
	var at time.Time
	require.NoError(l.t, l.db.Pool.QueryRow(ctx,
		`SELECT granted_at FROM ledger.lease_grants WHERE partition = $1 AND generation = $2`, partition, generation).Scan(&at))
	return at
}

// A primary dies (its client closes without releasing: the lease expires
// by its TTL); the standby, waiting in AcquireWait, takes over at the
// expiry, not a poll later. Its poll is set far beyond the test, so only
// waiting for the expiry the held reply told can bring it in time.
//
// Not parallel: it bounds a takeover to half a second.
func TestStandbyTakesOverWhenThePrimarysLeaseExpires(t *testing.T) {
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	const partition = 3
	primary := l.client(nil, worker.Config{Holder: "worker-a.1", TTL: time.Second})
	standby := l.client(nil, worker.Config{Holder: "worker-b.1", StandbyPoll: time.Hour})

	held, err := primary.Acquire(ctx, partition)
	require.NoError(t, err)
	done := acquireWaitAsync(ctx, standby, partition)
	// The standby stands by through a few of the primary's renewals.
	select {
	case r := <-done:
		t.Fatalf("AcquireWait returned while the primary held the lease: %v, %v", r.lease, r.err)
	case <-time.After(2500 * time.Millisecond):
	}

	require.NoError(t, primary.Close()) // dies: no release
	// A renewal the client gave up on may still be served: read the expiry
	// once nothing can move it any more (well before it comes).
	time.Sleep(200 * time.Millisecond)
	var expiredAt time.Time
	require.NoError(t, l.db.Pool.QueryRow(ctx, `SELECT expires_at FROM ledger.leases WHERE partition = $1`, partition).Scan(&expiredAt))
	lease := wait(t, done)
	require.Equal(t, held.Generation()+1, lease.Generation())
	took := l.grantedAt(ctx, partition, lease.Generation()).Sub(expiredAt)
	t.Logf("the standby was granted the partition %v after the primary's lease expired", took)
	require.Less(t, took, 500*time.Millisecond, "the standby took over %v after the expiry", took)
	require.NoError(t, lease.Context().Err())
}

// A primary on SIGTERM releases its lease long before its expiry; the
// standby notices it by its poll of lease.get, not at the expiry.
func TestStandbyTakesOverAReleasedLeaseWithinAPoll(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	const partition = 4
	primary := l.client(nil, worker.Config{Holder: "worker-a.1", TTL: 60 * time.Second})
	standby := l.client(nil, worker.Config{Holder: "worker-b.1", StandbyPoll: 100 * time.Millisecond})

	held, err := primary.Acquire(ctx, partition)
	require.NoError(t, err)
	done := acquireWaitAsync(ctx, standby, partition)
	select {
	case r := <-done:
		t.Fatalf("AcquireWait returned while the primary held the lease: %v, %v", r.lease, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	require.NoError(t, held.Release(ctx))
	released := time.Now()
	lease := wait(t, done)
	require.Equal(t, held.Generation()+1, lease.Generation())
	require.Less(t, time.Since(released), 10*time.Second, "the standby waited for the released lease's expiry")
}

func TestAcquireWaitEndsWithItsContextAndOnErrorsItCannotWaitOut(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)
	primary := l.client(nil, worker.Config{Holder: "worker-a.1", TTL: 30 * time.Second})
	standby := l.client(nil, worker.Config{Holder: "worker-b.1", StandbyPoll: 50 * time.Millisecond})
	_, err := primary.Acquire(ctx, 1)
	require.NoError(t, err)

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = standby.AcquireWait(short, 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	_, err = standby.AcquireWait(ctx, wire.PartitionsDefault) // no such partition
	require.ErrorIs(t, err, worker.ErrInvalid)
	_, err = primary.AcquireWait(ctx, 1)
	require.ErrorIs(t, err, worker.ErrLeaseActive)
}

// A worker configured with no partition count learns the deployment's, so
// PartitionOf agrees with the ingest whatever its -partitions.
func TestClientLearnsThePartitionCountFromTheService(t *testing.T) {
	t.Parallel()
	const n = 7
	l := newLedgerWith(t, fence.Config{Partitions: n})
	ctx := testCtx(t, 20*time.Second)

	// Before any lease (lease.get answers no_lease) and after one.
	fresh := l.client(nil, worker.Config{Holder: "worker-a.1"})
	require.Equal(t, n, fresh.Partitions())
	_, err := fresh.Acquire(ctx, 0)
	require.NoError(t, err)
	later := l.client(nil, worker.Config{Holder: "worker-b.1"})
	require.Equal(t, n, later.Partitions())

	differs := 0
	for _, task := range []string{"report-1", "report-2", "report-3", "report-4", "report-5", "invoice-42"} {
		require.Equal(t, wire.PartitionOf(task, n), later.PartitionOf(task), task)
		if wire.PartitionOf(task, n) != wire.PartitionOf(task, wire.PartitionsDefault) {
			differs++
		}
	}
	require.Positive(t, differs, "the tasks do not tell the two counts apart")

	configured := l.client(nil, worker.Config{Holder: "worker-c.1", Partitions: 32})
	require.Equal(t, 32, configured.Partitions(), "a configured count is not asked for")

	// No service, no client: New says why.
	ns := l.ns.Conn(t, worker.InboxOption("worker-d.1"))
	_, err = worker.New(ns, worker.Config{Holder: "worker-d.1", Prefix: "elsewhere", RequestTimeout: 200 * time.Millisecond})
	require.ErrorIs(t, err, worker.ErrUnavailable)
	require.ErrorContains(t, err, "partition count")
}
