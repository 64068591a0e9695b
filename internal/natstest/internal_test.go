package natstest

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFreePortsDistinctAndNeverReused(t *testing.T) {
	t.Parallel()
	lo, hi := portRange()
	seen := map[int]bool{}
	for range 3 {
		ports, err := freePorts(8)
		require.NoError(t, err)
		require.Len(t, ports, 8)
		for _, p := range ports {
			require.False(t, seen[p], "port %d handed out twice", p)
			seen[p] = true
			if hi-lo >= 100 {
				require.GreaterOrEqual(t, p, lo)
				require.Less(t, p, hi)
			}
		}
	}
}

func TestStartServerReportsPortInUse(t *testing.T) {
	t.Parallel()
	ports, err := freePorts(1)
	require.NoError(t, err)
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]))
	require.NoError(t, err)
	defer l.Close()

	o := newOptions(&config{}, "busy", t.TempDir())
	o.Port = ports[0]
	start := time.Now()
	srv, err := startServer(o, newLogger(t, false, ""), readyTimeout)
	require.Nil(t, srv)
	require.ErrorIs(t, err, errAddrInUse)
	require.Less(t, time.Since(start), 5*time.Second, "should fail fast, not wait for the ready timeout")
}

func TestClusterRoutesGoThroughProxies(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	// Every route connection has two ends, one on each node, and must be
	// one proxied connection; a direct route would count on the nodes only.
	require.Eventually(t, func() bool {
		routes, proxied := 0, 0
		for _, s := range c.Servers {
			routes += s.NumRoutes()
		}
		for _, p := range c.proxies {
			p.mu.Lock()
			proxied += len(p.conns)
			p.mu.Unlock()
		}
		return routes > 0 && routes == 2*proxied
	}, 5*time.Second, 10*time.Millisecond)

	// Kill a node that is not the meta leader (so no election is needed):
	// the survivors keep their route and the killed node's ID is refused by
	// the proxies, then Restart brings the node back (with a new ID).
	victim := (c.MetaLeader() + 1) % 3
	killedID := c.Servers[victim].ID()
	c.Kill(victim)
	require.False(t, c.Servers[victim].Running())
	require.True(t, c.killed.has(killedID))
	for j, s := range c.Servers {
		if j != victim {
			require.Eventually(t, func() bool { return s.NumRoutes() > 0 }, 5*time.Second, 10*time.Millisecond)
		}
	}
	c.Restart(t, victim)
	require.NotEqual(t, killedID, c.Servers[victim].ID())
	require.Eventually(t, func() bool { return c.Servers[victim].NumRoutes() > 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestRouteConnectID(t *testing.T) {
	t.Parallel()
	require.Equal(t, "NABC", routeConnectID([]byte(`CONNECT {"echo":true,"name":"NABC","cluster":"x"}`+"\r\n")))
	require.Equal(t, "", routeConnectID([]byte("INFO {}\r\n")))
	require.Equal(t, "", routeConnectID([]byte("CONNECT {bad\r\n")))
}
