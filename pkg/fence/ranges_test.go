package fence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// billing=0-15,reports=16-31: each principal leases only its own
// partitions, a principal named nowhere leases neither's, and partitions in
// no range stay open to everyone but the principals with ranges. A
// takeover of an expired lease is held to the ranges too.
func TestPrincipalLeasesOnlyItsPartitionRanges(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{Partitions: 40})
	ctx := context.Background()
	require.NoError(t, fence.SetPartitionRanges(ctx, db.Pool, "billing", []fence.Range{{0, 15}}, "ops", "split"))
	require.NoError(t, fence.SetPartitionRanges(ctx, db.Pool, "reports", []fence.Range{{16, 31}}, "ops", "split"))

	b, err := s.Acquire(ctx, 3, "billing.x", 100*time.Millisecond)
	require.NoError(t, err, "billing's own partition")
	_, err = s.Acquire(ctx, 20, "reports.a", longTTL)
	require.NoError(t, err, "reports' own partition")

	for _, c := range []struct {
		holder    string
		partition int
	}{{"billing.x", 20}, {"reports.a", 3}, {"reports.a", 35}, {"ops.1", 3}, {"ops.1", 20}} {
		_, err := s.Acquire(ctx, c.partition, c.holder, longTTL)
		require.ErrorIsf(t, err, fence.ErrForbidden, "%s acquires %d", c.holder, c.partition)
		var le *fence.LeaseError
		require.ErrorAs(t, err, &le)
		require.Equal(t, wire.ErrCodeForbidden, le.Code())
		require.Contains(t, le.Msg, fmt.Sprintf("partition %d is not within principal %s", c.partition, wire.Principal(c.holder)))
	}
	_, err = s.Acquire(ctx, 35, "ops.1", longTTL)
	require.NoError(t, err, "a partition in no range is open to a principal without ranges")

	require.Eventually(t, func() bool {
		l, err := s.Get(ctx, 3)
		return err == nil && !l.Valid
	}, 10*time.Second, 20*time.Millisecond)
	_, err = s.TakeOver(ctx, 3, "reports.a", b.Generation, longTTL)
	require.ErrorIs(t, err, fence.ErrForbidden, "an expired lease of billing's is not reports' to take")
	require.Zero(t, countRows(t, db, `SELECT count(*) FROM ledger.lease_grants WHERE holder LIKE 'reports.%' AND partition < 16`))

	require.NoError(t, fence.SetPartitionRanges(ctx, db.Pool, "billing", nil, "ops", "no more split"))
	_, err = s.TakeOver(ctx, 3, "ops.1", b.Generation, longTTL)
	require.NoError(t, err, "billing's ranges are gone: partition 3 is in no range")
	ranges, err := fence.PartitionRanges(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, ranges, 1)
	require.Equal(t, "reports", ranges[0].Principal)
	require.Equal(t, fence.Range{Lo: 16, Hi: 31}, ranges[0].Range)
	require.Equal(t, "split", ranges[0].Reason)
}

func TestParseRanges(t *testing.T) {
	t.Parallel()
	r, err := fence.ParseRanges("0-15, 32,40-47")
	require.NoError(t, err)
	require.Equal(t, []fence.Range{{0, 15}, {32, 32}, {40, 47}}, r)
	for _, bad := range []string{"a", "3-1", "-1", "1-", "1-2-3", ","} {
		_, err := fence.ParseRanges(bad)
		require.Errorf(t, err, "%q", bad)
	}
	r, err = fence.ParseRanges(" ")
	require.NoError(t, err)
	require.Empty(t, r)
}
