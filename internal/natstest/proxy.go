package natstest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Route proxies let Cluster.Kill cut a node off abruptly.
//
// nats-server's Shutdown is graceful: it first hands its raft leaderships
// to other nodes, so the cluster fails over at once. A crashed process
// cannot do that, and the other nodes only elect new leaders after their
// election timeout. To get that behaviour in-process, every node's route
// traffic goes through a proxy owned by this package: each node advertises
// its proxy's address and lists the proxies of all nodes as its routes.
// Kill first closes every route connection to and from the node (so nothing,
// not even a leadership transfer, reaches the other nodes) and then shuts
// the node down.
//
// A route connection's origin is known from the first line the dialing node
// sends, CONNECT {"name":"<server id>",...}.

// routeProxy forwards connections accepted on l to a node's route port.
type routeProxy struct {
	l      net.Listener
	target string
	killed *idSet // server IDs of killed nodes, shared by a cluster's proxies

	wg     sync.WaitGroup
	mu     sync.Mutex
	down   bool // target node killed: refuse and drop connections
	closed bool
	conns  map[*proxyConn]struct{}
}

type proxyConn struct {
	dialer, target net.Conn // dialer: the soliciting node's side
	origin         string   // server ID of the dialing node, guarded by routeProxy.mu
	once           sync.Once
}

func (pc *proxyConn) close() {
	pc.once.Do(func() {
		_ = pc.dialer.Close()
		_ = pc.target.Close()
	})
}

// idSet is a set of server IDs.
type idSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (s *idSet) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[string]bool{}
	}
	s.ids[id] = true
}

func (s *idSet) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[id]
}

// newRouteProxy listens on 127.0.0.1:port and forwards to 127.0.0.1:target.
func newRouteProxy(port, target int, killed *idSet) (*routeProxy, error) {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return nil, fmt.Errorf("natstest: route proxy: %w (%w)", err, errAddrInUse)
	}
	p := &routeProxy{
		l:      l,
		target: fmt.Sprintf("127.0.0.1:%d", target),
		killed: killed,
		conns:  map[*proxyConn]struct{}{},
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

func (p *routeProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		in, err := p.l.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		if p.closed || p.down {
			p.mu.Unlock()
			_ = in.Close()
			continue
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.handle(in)
	}
}

func (p *routeProxy) handle(in net.Conn) {
	defer p.wg.Done()
	out, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		_ = in.Close()
		return
	}
	pc := &proxyConn{dialer: in, target: out}
	p.mu.Lock()
	if p.closed || p.down {
		p.mu.Unlock()
		pc.close()
		return
	}
	p.conns[pc] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	defer func() {
		pc.close()
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()

	// target -> dialer (the accepting node speaks first, with INFO).
	go func() {
		defer p.wg.Done()
		_, _ = io.Copy(in, out)
		pc.close()
	}()

	// dialer -> target, learning the origin from the CONNECT line.
	br := bufio.NewReaderSize(in, 16<<10)
	line, err := br.ReadSlice('\n')
	if err != nil {
		return
	}
	if id := routeConnectID(line); id != "" {
		// Record the origin before checking it, so that a concurrent Kill
		// either sees the origin or we see the kill.
		p.mu.Lock()
		pc.origin = id
		p.mu.Unlock()
		if p.killed.has(id) {
			return
		}
	}
	if _, err := out.Write(line); err != nil {
		return
	}
	_, _ = io.Copy(out, br)
}

// routeConnectID returns the server ID from a route CONNECT line, or "".
func routeConnectID(line []byte) string {
	rest, ok := bytes.CutPrefix(line, []byte("CONNECT "))
	if !ok {
		return ""
	}
	var ci struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(bytes.TrimSpace(rest), &ci) != nil {
		return ""
	}
	return ci.Name
}

// setDown makes the proxy drop all its connections and refuse new ones
// (down) or forward again (!down).
func (p *routeProxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	var drop []*proxyConn
	if down {
		for pc := range p.conns {
			drop = append(drop, pc)
		}
	}
	p.mu.Unlock()
	for _, pc := range drop {
		pc.close()
	}
}

// dropFrom closes the connections dialed by the node with server ID id.
func (p *routeProxy) dropFrom(id string) {
	p.mu.Lock()
	var drop []*proxyConn
	for pc := range p.conns {
		if pc.origin == id {
			drop = append(drop, pc)
		}
	}
	p.mu.Unlock()
	for _, pc := range drop {
		pc.close()
	}
}

// close stops the proxy and waits for its goroutines.
func (p *routeProxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	_ = p.l.Close()
	for _, pc := range conns {
		pc.close()
	}
	p.wg.Wait()
}
