package sdktest

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/pkg/worker"
)

// The scenario: worker A's renewals stop reaching the service (its
// network goes silent: nothing is refused, nothing arrives); worker B takes
// the partition over as soon as the database lets it and commits its first
// event. A must have learned that it lost the lease before B's takeover was
// even granted, which precedes B's first commit.
//
// Not parallel: it measures timing, and the parallel tests wait until the
// sequential ones are done.
func TestWriterCutOffFromTheServiceLearnsItLostTheLeaseBeforeTheTakeoverCommits(t *testing.T) {
	l := newLedger(t)
	ctx := testCtx(t, 30*time.Second)
	const ttl = 500 * time.Millisecond
	const partition = 7

	u, err := url.Parse(l.ns.URL())
	require.NoError(t, err)
	proxy := faultproxy.Start(t, u.Host)
	ncA, err := nats.Connect("nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		worker.InboxOption("worker-a.1"))
	require.NoError(t, err)
	t.Cleanup(ncA.Close)
	a := newClient(t, ncA, worker.Config{Holder: "worker-a.1", TTL: ttl})
	b := l.client(nil, worker.Config{Holder: "worker-a.2"})

	leaseA, err := a.Acquire(ctx, partition)
	require.NoError(t, err)
	first, err := leaseA.Publish(ctx, "job-1", "started", []byte(`{"by":"a"}`))
	require.NoError(t, err)
	require.NoError(t, first.Wait(ctx))
	// A few renewals go through before the cut.
	time.Sleep(2 * ttl)
	require.NoError(t, leaseA.Context().Err())

	cutAt := time.Now()
	proxy.Silence() // for good: the harshest way to lose the service
	lostAt := make(chan time.Time, 1)
	go func() { <-leaseA.Context().Done(); lostAt <- time.Now() }()

	// B watches the lease (lease.get) and acquires the moment the database
	// shows it expired. (Watching rather than retrying acquire also keeps
	// the lease service from sending held errors, whose reply path races
	// in internal/ingest under -race.)
	ncB := l.ns.Conn(t)
	for *leaseGet(t, ncB, partition).Valid {
		time.Sleep(2 * time.Millisecond)
	}
	leaseB, err := b.Acquire(ctx, partition)
	require.NoError(t, err)
	// Checked synchronously the moment B's grant is confirmed: A's
	// context is already cancelled, so A knew first.
	select {
	case <-leaseA.Lost():
	default:
		t.Fatal("B was granted the partition before A learned it had lost the lease")
	}
	grantedB := time.Now()

	cause := context.Cause(leaseA.Context())
	require.ErrorIs(t, cause, worker.ErrLeaseLost)
	require.Contains(t, cause.Error(), "local deadline")
	tLost := <-lostAt
	require.True(t, tLost.Before(cutAt.Add(ttl)), "A learned %v after the cut, later than one TTL", tLost.Sub(cutAt))
	t.Logf("A lost the lease %v after the cut; B was granted it %v after the cut",
		tLost.Sub(cutAt), grantedB.Sub(cutAt))

	// B's first write commits, on the next generation and the next version.
	second, err := leaseB.Publish(ctx, "job-1", "resumed", []byte(`{"by":"b"}`))
	require.NoError(t, err)
	require.NoError(t, second.Wait(ctx))
	require.Equal(t, int64(2), second.Version())
	require.Equal(t, leaseA.Generation()+1, leaseB.Generation())

	// Both writes are in the log, each under its own generation, and A's
	// write committed (by the database clock) before A learned of the loss.
	var committedA, committedB time.Time
	require.NoError(t, l.db.Pool.QueryRow(ctx,
		`SELECT committed_at FROM ledger.events WHERE event_id = $1`, first.ID()).Scan(&committedA))
	require.NoError(t, l.db.Pool.QueryRow(ctx,
		`SELECT committed_at FROM ledger.events WHERE event_id = $1`, second.ID()).Scan(&committedB))
	require.True(t, committedA.Before(tLost) && tLost.Before(committedB),
		"A committed at %v, lost at %v, B committed at %v", committedA, tLost, committedB)
	rows := l.events("job-1")
	require.Len(t, rows, 2)
	require.Equal(t, []int64{leaseA.Generation(), leaseB.Generation()}, []int64{rows[0].Generation, rows[1].Generation})

	// A refuses to write on: nothing leaves a lost lease.
	_, err = leaseA.Publish(ctx, "job-1", "late", nil)
	require.ErrorIs(t, err, worker.ErrLeaseLost)
	require.Equal(t, 0, l.count(`SELECT count(*) FROM ledger.rejections`))
}
