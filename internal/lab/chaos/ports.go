package chaos

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// freePorts returns n distinct ports on 127.0.0.1 that were free when
// checked. They are drawn from below the kernel's ephemeral range: a
// process killed by a fault comes back on its old port, and a port in the
// ephemeral range may meanwhile be taken by an outgoing connection (even
// one reconnecting to that very port).
func freePorts(n int) ([]int, error) {
	lo, hi := 10000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if eph, err := strconv.Atoi(f[0]); err == nil && eph < hi && eph-lo >= 1000 {
				hi = eph
			}
		}
	}
	var ports []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for try := 0; len(ports) < n; try++ {
		if try == 1000 {
			return nil, fmt.Errorf("chaos: no free port in %d-%d", lo, hi-1)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo)))
		if err != nil {
			continue
		}
		held = append(held, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
