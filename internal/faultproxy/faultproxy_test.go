package faultproxy_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/faultproxy"
)

func TestCutDropsAndRefusesUntilRestore(t *testing.T) {
	t.Parallel()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = bufio.NewReader(c).WriteTo(c) }()
		}
	}()
	p := faultproxy.Start(t, echo.Addr().String())

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
