package sdktest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// PublishSnapshot makes the task a snapshot task: its events carry
// Ledger-Kind: snapshot and commit, the head says so, and a plain Publish
// to the task afterwards is refused invalid/wrong_kind.
func TestPublishSnapshotMakesASnapshotTask(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)
	c := l.client(nil, worker.Config{Holder: "sensors.a"})
	lease, err := c.Acquire(ctx, 4)
	require.NoError(t, err)
	for _, payload := range []string{`{"temp":20}`, `{"temp":23}`} {
		p, err := lease.PublishSnapshot(ctx, "gauge-1", "reading", []byte(payload))
		require.NoError(t, err)
		require.NoError(t, p.Wait(ctx))
	}
	head, err := c.TaskHead(ctx, "gauge-1")
	require.NoError(t, err)
	require.NotNil(t, head.Kind)
	require.Equal(t, wire.KindSnapshot, *head.Kind)
	require.EqualValues(t, 2, head.Version)

	p, err := lease.Publish(ctx, "gauge-1", "reading", []byte(`{"temp":24}`))
	require.NoError(t, err)
	var rejected *worker.RejectedError
	require.True(t, errors.As(p.Wait(ctx), &rejected))
	require.Equal(t, wire.ReasonWrongKind, rejected.Receipt.Reason)
	require.Equal(t, 2, l.count(`SELECT count(*) FROM ledger.events WHERE task_id = 'gauge-1'`))
}
