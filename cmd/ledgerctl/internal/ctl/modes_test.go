package ctl_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// An operator puts a partition in observe mode, a zombie's write commits
// there, would-reject counts it, and the switches are listed with who.
func TestFenceModeSwitchAndWouldRejectReport(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	a := e.acquire(4, "worker-a.1")

	r := e.run("fence-mode", "-partition", "4", "-reason", "rollout", "-by", "carol", "observe").ok(t)
	assert.Contains(t, r.stdout, "partition 4: fence mode observe")
	lines := e.run("fence-mode", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, "observe", lines[0]["mode"])
	assert.Equal(t, "carol", lines[0]["by"])

	lines = e.run("leases", "-partition", "4", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, "observe", lines[0]["fence_mode"])
	assert.Contains(t, e.run("leases").ok(t).stdout, "fence observe")

	e.expire(4)
	b := e.acquire(4, "worker-a.2")
	ev := func(l fence.Lease, v int64) fence.Event {
		return fence.Event{ID: newID(), Partition: 4, Task: "job-1", Version: v, Type: "step", Payload: []byte(`{}`),
			Holder: l.Holder, Generation: l.Generation}
	}
	res, err := e.store.Append(ctx, []fence.Event{ev(b, 1), ev(a, 2)})
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[1].Verdict)
	require.Equal(t, "stale/superseded", res[1].WouldReject)

	lines = e.run("would-reject", "-since", "1h", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, float64(4), lines[0]["partition"])
	assert.Equal(t, "stale/superseded", lines[0]["would_reject"])
	assert.Equal(t, float64(1), lines[0]["count"])
	assert.Empty(t, e.run("would-reject", "-since", "1h", "-partitions", "3,5", "-json").ok(t).jsonLines(t))

	e.run("fence-mode", "-partition", "4", "-reason", "zero for a week", "-by", "carol", "enforce").ok(t)
	hist := e.run("leases", "-history", "-partition", "4", "-json").ok(t).jsonLines(t)
	var kinds []string
	for _, h := range hist {
		kinds = append(kinds, h["action"].(string))
	}
	assert.Equal(t, []string{"enforce", "grant", "observe", "grant"}, kinds)

	assert.Equal(t, 2, e.run("fence-mode", "-partition", "4", "-reason", "x", "shadow").code)
	assert.Equal(t, 2, e.run("would-reject").code, "-since is required")
}
