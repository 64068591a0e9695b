package natstest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Port selection.
//
// Servers get explicit ports instead of letting the kernel pick one (port
// -1/0) because a server must come back on the same ports after Restart, and
// a kernel-picked port lies in the ephemeral range: while the server is down,
// the same kernel may hand that port to an outgoing connection, for example
// to a client or route reconnecting to the very port (a TCP self-connect),
// and the restarted server then fails with "address already in use".
//
// So ports are drawn at random from below the ephemeral range (10000-32767
// on a default Linux, macOS or Windows), where the kernel never picks local
// ports for outgoing connections. Each port is checked by listening on it,
// and is handed out only once per test binary, so tests running in parallel
// never get the same port, not even while one of them has a node stopped.
// A collision with another process remains possible between the check and
// the server's bind; Start and StartCluster retry with new ports then.

const (
	portRangeLow  = 10000
	portRangeHigh = 32768 // exclusive; start of the default Linux ephemeral range
	portTries     = 1000
)

var portsUsed = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// freePorts returns n distinct ports on 127.0.0.1 that were free when
// checked and were not handed out before by this process.
func freePorts(n int) ([]int, error) {
	lo, hi := portRange()
	if hi-lo < 100 {
		return kernelPorts(n)
	}

	portsUsed.Lock()
	defer portsUsed.Unlock()
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for try := 0; len(ports) < n; try++ {
		if try == portTries {
			return nil, fmt.Errorf("natstest: no free port in %d-%d after %d tries", lo, hi-1, portTries)
		}
		p := lo + rand.IntN(hi-lo)
		if portsUsed.m[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ls = append(ls, l)
		ports = append(ports, p)
	}
	for _, p := range ports {
		portsUsed.m[p] = true
	}
	return ports, nil
}

// portRange returns the range [lo, hi) to draw ports from.
func portRange() (lo, hi int) {
	lo, hi = portRangeLow, portRangeHigh
	// On Linux, stay below the configured ephemeral range.
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if eph, err := strconv.Atoi(f[0]); err == nil && eph < hi {
				hi = eph
			}
		}
	}
	return lo, hi
}

// kernelPorts is the fallback when the ephemeral range leaves no room below
// it: n distinct kernel-picked ports, listening on all at once.
func kernelPorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("natstest: finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
