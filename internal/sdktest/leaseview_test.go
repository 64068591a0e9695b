package sdktest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// viewOf reads partition's value of ledger_leases, as a downstream reader
// would (nil if there is none).
func viewOf(ctx context.Context, t *testing.T, kv jetstream.KeyValue, partition int) *wire.LeaseView {
	t.Helper()
	e, err := kv.Get(ctx, wire.LeaseViewKey(partition))
	if err != nil {
		require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
		return nil
	}
	var v wire.LeaseView
	require.NoError(t, json.Unmarshal(e.Value(), &v))
	return &v
}

// The leases view follows a grant, the renewals, a takeover and a release,
// and a watcher sees each new generation.
func TestLeasesViewFollowsGrantsRenewalsAndReleases(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	kv, err := l.ns.JetStream(t).KeyValue(ctx, wire.BucketLeases)
	require.NoError(t, err)
	w, err := kv.Watch(ctx, wire.LeaseViewKey(6), jetstream.UpdatesOnly())
	require.NoError(t, err)
	defer w.Stop() //nolint:errcheck

	a := l.client(nil, worker.Config{Holder: "payments.a", TTL: 600 * time.Millisecond})
	la, err := a.Acquire(ctx, 6)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		v := viewOf(ctx, t, kv, 6)
		return v != nil && v.Fence() == la.Fence() && !v.Released && v.TTLMillis == 600
	}, 5*time.Second, 10*time.Millisecond)
	expiry := func() time.Time {
		at, err := time.Parse(time.RFC3339Nano, viewOf(ctx, t, kv, 6).ExpiresAt)
		require.NoError(t, err)
		return at
	}
	first := expiry()
	require.Eventually(t, func() bool { return expiry().After(first) }, 5*time.Second, 10*time.Millisecond,
		"a renewal moves the expiry")

	// A is paused past its TTL: B takes over.
	require.NoError(t, a.Close())
	ledgertest.ExpireLease(t, l.db.Pool, 6)
	b := l.client(nil, worker.Config{Holder: "payments.b"})
	lb, err := b.Acquire(ctx, 6)
	require.NoError(t, err)
	require.Equal(t, la.Generation()+1, lb.Generation())
	require.Eventually(t, func() bool {
		v := viewOf(ctx, t, kv, 6)
		return v.Fence() == lb.Fence() && !v.Released
	}, 5*time.Second, 10*time.Millisecond)

	require.NoError(t, lb.Release(ctx))
	require.Eventually(t, func() bool {
		v := viewOf(ctx, t, kv, 6)
		return v.Fence() == lb.Fence() && v.Released && v.ExpiresAt == ""
	}, 5*time.Second, 10*time.Millisecond)

	gens := map[int64]bool{}
	timeout := time.After(5 * time.Second)
	for !gens[lb.Generation()] {
		select {
		case e := <-w.Updates():
			var v wire.LeaseView
			require.NoError(t, json.Unmarshal(e.Value(), &v))
			gens[v.Generation] = true
		case <-timeout:
			t.Fatalf("the watcher saw generations %v, not %d", gens, lb.Generation())
		}
	}
	require.True(t, gens[la.Generation()], "the watcher saw the first holder too: %v", gens)
}
