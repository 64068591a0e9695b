// Package faultproxy is a TCP proxy for tests and the chaos command that
// can cut the network between a client and a real server (PostgreSQL,
// NATS), or silence it, and restore it, to prove behaviour under outages
// without mocking either side.
package faultproxy

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards connections from Addr to a target until Cut.
type Proxy struct {
	ln      net.Listener
	network string
	target  string

	silent atomic.Bool
	// dropped and refused count the client connections Cut dropped and
	// those refused while cut: proof that a cut reached a client.
	dropped, refused atomic.Int64

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Start listens on a random loopback port and forwards to target
// ("host:port"). It is closed at the end of the test.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := New("tcp", target)
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// New listens on a random loopback TCP port and forwards each connection
// to target on network ("tcp" with "host:port", "unix" with a socket's
// path, as a local PostgreSQL's). The caller closes it.
func New(network, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	p := &Proxy{ln: ln, network: network, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's "host:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut drops every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	// conns holds both halves of each connection, and pipe removes both
	// together.
	p.dropped.Add(int64(len(p.conns) / 2))
	for c := range p.conns {
		_ = c.Close()
	}
}

// Dropped is how many client connections Cut has dropped so far.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Refused is how many client connections were refused while cut.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// Silence stops forwarding without closing anything: both directions are
// read and dropped, and connections, open or new, stay up. The client sees
// nothing but silence, as behind a partition that drops packets, which is
// harder to notice than a cut.
func (p *Proxy) Silence() { p.silent.Store(true) }

// Restore accepts and forwards connections again, after Cut or Silence.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
	p.silent.Store(false)
}

// Close stops the proxy.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		up, err := net.Dial(p.network, p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	// However the copy ends (EOF, a reset, a closed socket), both halves
	// end: a peer that reset its side must not leave the other waiting on
	// a connection nothing will ever answer.
	_ = p.copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, src)
	delete(p.conns, dst)
	p.mu.Unlock()
}

// copy forwards src to dst (dropping what it reads while silenced) until
// either side fails.
func (p *Proxy) copy(dst, src net.Conn) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.silent.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			return err
		}
	}
}
