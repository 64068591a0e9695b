package faultproxy_test

import (
	"bufio"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/faultproxy"
)

func TestCutDropsAndRefusesUntilRestore(t *testing.T) {
	t.Parallel()
	p := faultproxy.Start(t, startEcho(t))

	roundTrip := func() error {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		_, err = bufio.NewReader(c).ReadString('\n')
		return err
	}
	require.NoError(t, roundTrip())
	p.Cut()
	require.Error(t, roundTrip(), "traffic passed a cut proxy")
	p.Restore()
	require.NoError(t, roundTrip())
}

func TestSilenceDropsTrafficButKeepsConnectionsUntilRestore(t *testing.T) {
	t.Parallel()
	p := faultproxy.Start(t, startEcho(t))
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	ping := func() error {
		_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		_, err := r.ReadString('\n')
		return err
	}
	require.NoError(t, ping())

	p.Silence()
	err = ping()
	var nerr net.Error
	require.ErrorAs(t, err, &nerr, "a silenced proxy must neither answer nor close")
	require.True(t, nerr.Timeout(), "want a timeout, got %v", err)
	// New connections are accepted, and are just as silent.
	c2, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	require.NoError(t, err)
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(300 * time.Millisecond))
	_, err = c2.Write([]byte("ping\n"))
	require.NoError(t, err)
	_, err = bufio.NewReader(c2).ReadString('\n')
	require.ErrorAs(t, err, &nerr)
	require.True(t, nerr.Timeout())

	p.Restore()
	// The first connection lives on: what is sent now comes back.
	require.NoError(t, ping())
}

// startEcho starts a TCP server that echoes what it reads, and returns its
// address.
func startEcho(t *testing.T) string {
	t.Helper()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = bufio.NewReader(c).WriteTo(c) }()
		}
	}()
	return echo.Addr().String()
}

// A server that resets its connection (as a PostgreSQL backend killed by an
// immediate shutdown can) ends the client's connection too: the client must
// not wait for ever on a connection whose other half is gone.
func TestUpstreamResetEndsTheClientsConnection(t *testing.T) {
	t.Parallel()
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			// Read the request, then reset: close with unread data and
			// linger 0, which sends RST rather than FIN.
			buf := make([]byte, 1)
			_, _ = c.Read(buf)
			_ = c.(*net.TCPConn).SetLinger(0)
			_ = c.Close()
		}
	}()
	p := faultproxy.Start(t, srv.Addr().String())
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("query that is never answered\n"))
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the client still waits after the server reset: %v", err)
}

// Cut counts the connections it dropped and those it refused while cut.
func TestCutCountsWhatItDroppedAndRefused(t *testing.T) {
	t.Parallel()
	p := faultproxy.Start(t, startEcho(t))
	for range 2 {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		// An echo proves the proxy holds the connection.
		_, err = c.Write([]byte("x\n"))
		require.NoError(t, err)
		_, err = bufio.NewReader(c).ReadString('\n')
		require.NoError(t, err)
	}
	require.Zero(t, p.Dropped())
	p.Cut()
	require.EqualValues(t, 2, p.Dropped())
	require.Zero(t, p.Refused())

	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.Eventually(t, func() bool { return p.Refused() == 1 }, 5*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 2, p.Dropped(), "a refused connection is not a dropped one")
}
