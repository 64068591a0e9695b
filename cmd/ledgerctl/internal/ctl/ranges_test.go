package ctl_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
)

// An operator gives billing partitions 0-3: billing is granted them and
// nothing else, reports none of them; the ranges are listed with who set
// them, and cleared.
func TestPartitionRangesSetListAndClear(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	r := e.run("partition-ranges", "-principal", "billing", "-ranges", "0-3", "-reason", "tenant split", "-by", "carol").ok(t)
	assert.Contains(t, r.stdout, "principal billing: partitions 0-3")
	lines := e.run("partition-ranges", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, "billing", lines[0]["principal"])
	assert.Equal(t, float64(0), lines[0]["lo"])
	assert.Equal(t, float64(3), lines[0]["hi"])
	assert.Equal(t, "carol", lines[0]["by"])
	assert.Contains(t, e.run("partition-ranges").ok(t).stdout, "tenant split")

	e.acquire(2, "billing.x")
	_, err := e.store.Acquire(ctx, 5, "billing.x", 0)
	require.ErrorIs(t, err, fence.ErrForbidden)
	_, err = e.store.Acquire(ctx, 1, "reports.a", 0)
	require.ErrorIs(t, err, fence.ErrForbidden)

	e.run("partition-ranges", "-principal", "billing", "-clear", "-reason", "merged").ok(t)
	assert.Contains(t, e.run("partition-ranges").ok(t).stdout, "no partition ranges")
	e.acquire(1, "reports.a")

	assert.Equal(t, 2, e.run("partition-ranges", "-principal", "billing", "-ranges", "3-1", "-reason", "x").code)
	assert.Equal(t, 2, e.run("partition-ranges", "-principal", "billing", "-ranges", "1").code, "-reason is required")
	assert.Equal(t, 2, e.run("partition-ranges", "-ranges", "1").code, "-principal is required")
}
