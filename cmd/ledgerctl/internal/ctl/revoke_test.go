package ctl_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/fence"
)

// An operator revokes, cordons and uncordons from ledgerctl; leases shows
// the revoke and the cordon, and leases -history every action with who
// and why beside the grants.
func TestOperatorActionsAreRecordedAndShown(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withIngest(ingest.Config{})
	a := e.acquire(3, "worker-a.1")

	r := e.run("revoke", "-partition", "3", "-reason", "zombie suspected", "-by", "alice", "-json").ok(t)
	lines := r.jsonLines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, "revoke", lines[0]["action"])
	assert.Equal(t, "worker-a.1", lines[0]["holder"])
	assert.Equal(t, float64(a.Generation), lines[0]["generation"])
	newGen := lines[0]["new_generation"].(float64)
	assert.Greater(t, newGen, float64(a.Generation))

	e.run("cordon", "-partition", "3", "-reason", "disk swap", "-by", "bob").ok(t)
	_, err := e.store.Acquire(context.Background(), 3, "worker-b.1", 0)
	require.ErrorIs(t, err, fence.ErrHeld, "a cordoned partition is granted to nobody")

	lines = e.run("leases", "-partition", "3", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, newGen, lines[0]["generation"])
	require.NotNil(t, lines[0]["revoked"])
	assert.Equal(t, "zombie suspected", lines[0]["revoked"].(map[string]any)["reason"])
	require.NotNil(t, lines[0]["cordoned"])
	assert.Equal(t, "bob", lines[0]["cordoned"].(map[string]any)["by"])

	table := e.run("leases").ok(t).stdout
	assert.Contains(t, table, "revoked worker-a.1")
	assert.Contains(t, table, "cordoned by bob")

	e.run("uncordon", "-partition", "3", "-reason", "swapped", "-by", "bob").ok(t)
	e.acquire(3, "worker-b.1")

	hist := e.run("leases", "-history", "-partition", "3", "-json").ok(t).jsonLines(t)
	var kinds []string
	for _, h := range hist {
		kinds = append(kinds, h["action"].(string))
	}
	assert.Equal(t, []string{"grant", "uncordon", "cordon", "revoke", "grant"}, kinds)
	assert.Equal(t, "swapped", hist[1]["reason"])
	assert.Equal(t, "alice", hist[3]["by"])

	r = e.run("revoke", "-partition", "3")
	assert.Equal(t, 2, r.code, "a revoke without a reason is a usage error")
	assert.Contains(t, r.stderr, "-reason is required")
}
