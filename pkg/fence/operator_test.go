package fence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// An operator revokes a holder whose lease has most of its TTL left: its
// next write is stale/superseded and its renewal lost with the revoke's
// reason, and another holder takes the partition at once.
func TestRevokedHoldersNextWriteIsStaleWithoutWaitingForTheTTL(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()

	a, err := s.Acquire(ctx, 2, "worker-a.1", longTTL)
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, appendOne(t, s, ev(a, "job-1", 1, "running")).Verdict)

	var witnessed int64
	act, err := fence.Revoke(ctx, db.Pool, 2, "ops@host", "node is being drained", 0,
		func(_ context.Context, g int64) error { witnessed = g; return nil })
	require.NoError(t, err)
	require.Equal(t, "worker-a.1", act.Holder)
	require.Equal(t, a.Generation, act.Generation)
	require.Greater(t, act.NewGeneration, a.Generation)
	require.Equal(t, act.NewGeneration, witnessed, "the new generation is witnessed before the revoke commits")

	late := appendOne(t, s, ev(a, "job-1", 2, "completed"))
	require.Equal(t, wire.VerdictStale, late.Verdict)
	require.Equal(t, wire.ReasonSuperseded, late.Reason)
	require.Equal(t, act.NewGeneration, late.CurrentGeneration)

	_, err = s.Renew(ctx, 2, "worker-a.1", a.Generation, 0)
	require.ErrorIs(t, err, fence.ErrLost)
	var le *fence.LeaseError
	require.ErrorAs(t, err, &le)
	require.NotNil(t, le.Revoked, "the lost reply names the revoke: %v", err)
	require.Equal(t, "node is being drained", le.Revoked.Reason)
	require.Equal(t, "ops@host", le.Revoked.By)

	b, err := s.Acquire(ctx, 2, "worker-b.1", longTTL)
	require.NoError(t, err, "the partition is free at once, not after the revoked lease's TTL")
	require.Greater(t, b.Generation, act.NewGeneration, "no grant repeats the revoke's generation")

	require.Equal(t, 1, countRows(t, db, `SELECT count(*) FROM ledger.lease_actions
		WHERE partition = 2 AND action = 'revoke' AND by_name = 'ops@host' AND reason = 'node is being drained'
		  AND generation = $1 AND new_generation = $2 AND db_user = session_user`, a.Generation, act.NewGeneration))
}

// A revoke raises the generation above the witness's floor, and one whose
// witness fails changes nothing.
func TestRevokeRespectsTheWitnessFloor(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	a, err := s.Acquire(ctx, 1, "worker-a.1", longTTL)
	require.NoError(t, err)

	boom := errors.New("witness unreachable")
	_, err = fence.Revoke(ctx, db.Pool, 1, "ops", "try", 0, func(context.Context, int64) error { return boom })
	require.ErrorIs(t, err, boom)
	cur, err := s.Get(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, a.Generation, cur.Generation, "a revoke whose witness failed is rolled back")
	require.True(t, cur.Valid)
	require.Zero(t, countRows(t, db, `SELECT count(*) FROM ledger.lease_actions`))

	act, err := fence.Revoke(ctx, db.Pool, 1, "ops", "fence above the witness", a.Generation+10, nil)
	require.NoError(t, err)
	require.Equal(t, a.Generation+10, act.NewGeneration)

	_, err = fence.Revoke(ctx, db.Pool, 9, "ops", "nobody there", 0, nil)
	require.ErrorIs(t, err, fence.ErrNeverLeased)
}

// A cordoned partition is granted to nobody, its own holder included,
// while that holder keeps renewing (it drains); uncordoned, it is granted
// again. A partition never leased can be cordoned too.
func TestCordonedPartitionIsGrantedToNobodyUntilUncordoned(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	a, err := s.Acquire(ctx, 4, "worker-a.1", longTTL)
	require.NoError(t, err)

	_, err = fence.Cordon(ctx, db.Pool, 4, true, "ops", "moving partition 4")
	require.NoError(t, err)
	_, err = fence.Cordon(ctx, db.Pool, 5, true, "ops", "never used")
	require.NoError(t, err)

	_, err = s.Renew(ctx, 4, "worker-a.1", a.Generation, 0)
	require.NoError(t, err, "the holder of a cordoned partition drains: it may renew")
	_, err = s.Acquire(ctx, 4, "worker-a.1", longTTL)
	requireCordoned(t, err, "moving partition 4")

	expire(t, db, 4)
	_, err = s.Acquire(ctx, 4, "worker-b.1", longTTL)
	requireCordoned(t, err, "moving partition 4")
	_, err = s.TakeOver(ctx, 4, "worker-b.1", a.Generation, longTTL)
	requireCordoned(t, err, "moving partition 4")
	_, err = s.Acquire(ctx, 5, "worker-b.1", longTTL)
	requireCordoned(t, err, "never used")
	require.Zero(t, countRows(t, db, `SELECT count(*) FROM ledger.lease_grants WHERE partition IN (4, 5) AND generation > $1`, a.Generation))

	cordons, err := fence.Cordons(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, cordons, 2)

	_, err = fence.Cordon(ctx, db.Pool, 4, false, "ops", "moved")
	require.NoError(t, err)
	b, err := s.Acquire(ctx, 4, "worker-b.1", longTTL)
	require.NoError(t, err)
	require.Equal(t, a.Generation+1, b.Generation)

	acts, err := fence.Actions(ctx, db.Pool, 4, 10)
	require.NoError(t, err)
	require.Len(t, acts, 2)
	require.Equal(t, fence.ActionUncordon, acts[0].Kind)
	require.Equal(t, "moved", acts[0].Reason)
	require.Equal(t, fence.ActionCordon, acts[1].Kind)
	require.Equal(t, "worker-a.1", acts[1].Holder)
}

func requireCordoned(t *testing.T, err error, reason string) {
	t.Helper()
	require.ErrorIs(t, err, fence.ErrHeld)
	var le *fence.LeaseError
	require.ErrorAs(t, err, &le)
	require.NotNil(t, le.Cordon, "the held error names the cordon: %v", err)
	require.Equal(t, reason, le.Cordon.Reason)
	require.Equal(t, wire.ErrCodeHeld, le.Code())
}
