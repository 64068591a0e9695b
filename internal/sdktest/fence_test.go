package sdktest

import (
	"net/http"
	"net/http/httptest"
	"strings"
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

// A worker's calls through FenceTransport carry its lease's fence, and once
// the lease has ended they are not sent at all.
func TestFenceTransportSendsTheLeasesFenceUntilTheLeaseEnds(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 30*time.Second)
	c := l.client(nil, worker.Config{Holder: "payments.pod-1"})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get(wire.HeaderFence))
	}))
	defer srv.Close()
	hc := &http.Client{Transport: &worker.FenceTransport{Source: lease}}
	resp, err := hc.Post(srv.URL, "text/plain", strings.NewReader("charge"))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, []string{lease.Fence().String()}, got)

	require.NoError(t, lease.Release(ctx))
	_, err = hc.Post(srv.URL, "text/plain", strings.NewReader("charge"))
	require.ErrorIs(t, err, worker.ErrReleased)
	require.Len(t, got, 1, "nothing was sent after the release")
}
