package connect

import (
	"flag"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/admin"
)

// adminListener parses args the way a service does and starts the admin
// endpoints where -admin-addr says, returning the address they listen on.
func adminListener(t *testing.T, args ...string) *net.TCPAddr {
	t.Helper()
	var s Service
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s.Register(fs, "0") // port 0: any free port, on the default host
	// fs.Parse rather than s.Parse: the environment errors Parse reports
	// are process-wide, and another test of this package leaves some.
	require.NoError(t, fs.Parse(args))
	srv, err := admin.Start(s.AdminAddr, prometheus.NewRegistry(), nil, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	addr, err := net.ResolveTCPAddr("tcp", srv.Addr())
	require.NoError(t, err)
	return addr
}

// The admin endpoints are reachable from this host only, unless the
// operator widens the address.
func TestAdminEndpointsListenOnLoopbackByDefault(t *testing.T) {
	t.Setenv("LEDGER_ADMIN_ADDR", "")
	addr := adminListener(t)
	require.Truef(t, addr.IP.IsLoopback(), "default admin address %s is not loopback", addr)

	require.True(t, adminListener(t, "-admin-addr", "0.0.0.0:0").IP.IsUnspecified(), "the flag widens it")
	t.Setenv("LEDGER_ADMIN_ADDR", "0.0.0.0:0")
	require.True(t, adminListener(t).IP.IsUnspecified(), "the environment widens it")
}

func TestAdminPortMustBeBare(t *testing.T) {
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	var s Service
	require.Panics(t, func() { s.Register(fs, ":9090") }, "an address where a port belongs")
}
