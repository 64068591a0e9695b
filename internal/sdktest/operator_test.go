package sdktest

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// An operator revokes a worker's lease (ledgerctl revoke): the worker's
// lease ends at its next renewal, well before its TTL, with ErrLeaseLost
// and the revoke's reason; the new generation is witnessed, and the next
// grant is above it.
func TestRevokeEndsTheHoldersLeaseWithTheReason(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 30*time.Second)
	// Renewals every 10 s: the loss must come from the revoke, not the TTL.
	a := l.client(nil, worker.Config{Holder: "worker-a.1", TTL: 30 * time.Second})
	lease, err := a.Acquire(ctx, 3)
	require.NoError(t, err)
	p, err := lease.PublishJSON(lease.Context(), "job-9", "running", map[string]int{"step": 1})
	require.NoError(t, err)
	require.NoError(t, p.Wait(ctx))

	js := l.ns.JetStream(t)
	act, err := ingest.Revoke(ctx, js, l.db.Pool, 3, "ops@bastion", "host retired")
	require.NoError(t, err)
	require.Equal(t, lease.Generation(), act.Generation)

	kv, err := js.KeyValue(ctx, wire.BucketWitness)
	require.NoError(t, err)
	e, err := kv.Get(ctx, "gen-3")
	require.NoError(t, err)
	require.Equal(t, strconv.FormatInt(act.NewGeneration, 10), string(e.Value()), "the revoke's generation is witnessed")

	// The worker's next event comes back stale/superseded and ends the lease.
	p, err = lease.PublishJSON(lease.Context(), "job-9", "completed", nil)
	require.NoError(t, err)
	var rej *worker.RejectedError
	require.ErrorAs(t, p.Wait(ctx), &rej)
	require.Equal(t, wire.VerdictStale, rej.Receipt.Verdict)
	require.Equal(t, wire.ReasonSuperseded, rej.Receipt.Reason)
	select {
	case <-lease.Lost():
	case <-ctx.Done():
		t.Fatal("the revoked lease did not end")
	}
	require.ErrorIs(t, context.Cause(lease.Context()), worker.ErrLeaseLost)

	b := l.client(nil, worker.Config{Holder: "worker-b.1"})
	lb, err := b.Acquire(ctx, 3)
	require.NoError(t, err, "the revoked partition is free at once")
	require.Greater(t, lb.Generation(), act.NewGeneration)
}

// A revoked worker that publishes nothing learns of the revoke at its next
// renewal: the lease ends with ErrLeaseLost, and the refused renewal names
// who revoked it and why.
func TestRevokedLeaseIsLostAtTheNextRenewalWithTheReason(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 30*time.Second)
	a := l.client(nil, worker.Config{Holder: "worker-a.1", TTL: 3 * time.Second})
	lease, err := a.Acquire(ctx, 5)
	require.NoError(t, err)

	_, err = ingest.Revoke(ctx, l.ns.JetStream(t), l.db.Pool, 5, "ops@bastion", "suspected zombie")
	require.NoError(t, err)
	select {
	case <-lease.Lost():
	case <-ctx.Done():
		t.Fatal("the revoked lease did not end")
	}
	cause := context.Cause(lease.Context())
	require.ErrorIs(t, cause, worker.ErrLeaseLost)
	var se *worker.ServiceError
	require.ErrorAs(t, cause, &se, "the loss comes from the refused renewal: %v", cause)
	require.NotNil(t, se.Revoked, "the refused renewal names the revoke: %v", cause)
	require.Equal(t, "suspected zombie", se.Revoked.Reason)
	require.Equal(t, "ops@bastion", se.Revoked.By)
	require.Contains(t, cause.Error(), "suspected zombie")
}

// A cordoned partition is refused to every worker with ErrHeld and the
// cordon; the holder keeps renewing; after the uncordon a standby takes it.
func TestCordonedPartitionIsRefusedToWorkersUntilUncordoned(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 30*time.Second)
	a := l.client(nil, worker.Config{Holder: "worker-a.1", TTL: 600 * time.Millisecond})
	b := l.client(nil, worker.Config{Holder: "worker-b.1"})
	la, err := a.Acquire(ctx, 7)
	require.NoError(t, err)

	cordon, err := fence.Cordon(ctx, l.db.Pool, 7, true, "ops", "rebalancing")
	require.NoError(t, err)
	// A renewal passes while cordoned: the holder drains.
	nc := l.ns.Conn(t)
	require.Eventually(t, func() bool {
		exp, err := time.Parse(time.RFC3339Nano, leaseGet(t, nc, 7).ExpiresAt)
		return err == nil && exp.After(cordon.At.Add(600*time.Millisecond))
	}, 10*time.Second, 20*time.Millisecond, "no renewal after the cordon")
	require.NoError(t, la.Context().Err(), "the holder of a cordoned partition keeps its lease")
	require.NoError(t, la.Release(ctx))

	_, err = b.Acquire(ctx, 7)
	require.ErrorIs(t, err, worker.ErrHeld)
	var se *worker.ServiceError
	require.ErrorAs(t, err, &se)
	require.NotNil(t, se.Cordoned, "the held reply names the cordon: %v", err)
	require.Equal(t, "rebalancing", se.Cordoned.Reason)

	waited := make(chan error, 1)
	go func() {
		lb, err := b.AcquireWait(ctx, 7)
		if err == nil && lb.Generation() <= la.Generation() {
			err = errors.New("standby granted a generation that is not above the drained one")
		}
		waited <- err
	}()
	select {
	case err := <-waited:
		t.Fatalf("a standby was granted a cordoned partition: %v", err)
	case <-time.After(time.Second):
	}
	_, err = fence.Cordon(ctx, l.db.Pool, 7, false, "ops", "done")
	require.NoError(t, err)
	require.NoError(t, <-waited)
}
