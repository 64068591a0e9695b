package sdktest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// A lease's fence names what the ledger granted: the partition, the holder
// and the generation the lease service reports for it.
func TestLeaseFenceIsTheGrantedOne(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 30*time.Second)
	c := l.client(nil, worker.Config{Holder: "payments.pod-1"})
	lease, err := c.Acquire(ctx, 5)
	require.NoError(t, err)
	got := leaseGet(t, l.ns.Conn(t), 5)
	want := wire.Fence{Partition: 5, Holder: got.Holder, Generation: got.Generation}
	require.Equal(t, want, lease.Fence())
	parsed, err := wire.ParseFence(lease.Fence().String())
	require.NoError(t, err)
	require.Equal(t, want, parsed)
}
