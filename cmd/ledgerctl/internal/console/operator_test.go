package console_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/fence"
)

// The partitions view shows a cordoned partition's cordon on its tile,
// and every operator action with who and why.
func TestPartitionsViewShowsOperatorActions(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := context.Background()
	l.acquire(2, "worker-a.1")
	_, err := ingest.Revoke(ctx, l.js, l.db.Pool, 2, "alice", "zombie drill")
	require.NoError(t, err)
	_, err = fence.Cordon(ctx, l.db.Pool, 2, true, "bob", "disk swap")
	require.NoError(t, err)

	_, err = fence.SetFenceMode(ctx, l.db.Pool, 5, fence.ModeObserve, "carol", "rollout")
	require.NoError(t, err)

	base := l.console()
	body := eventually(t, base+"/frag/partitions", "cordoned by bob")
	require.Regexp(t, `id="partition-5"[^>]*>\s*<h2>partition 5</h2>\s*<p class="mode mode-observe">fence: <b>observe</b>`, body,
		"the tile shows the effective fence mode")
	require.Regexp(t, `<h2>partition 2</h2>\s*<p class="mode mode-enforce">`, body)
	require.Contains(t, body, "disk swap")
	require.Contains(t, body, "Operator actions")
	require.Contains(t, body, "zombie drill")
	require.Contains(t, body, "alice")
}
