package natstest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// clusterReadyTimeout bounds how long WaitReady waits for a meta leader
	// that sees all running nodes.
	clusterReadyTimeout = 30 * time.Second

	// globalAccount is the account clients use when no accounts are
	// configured (also with WithUserPassword).
	globalAccount = server.DEFAULT_GLOBAL_ACCOUNT
)

// Cluster is an in-process JetStream cluster of n servers, all on 127.0.0.1.
type Cluster struct {
	// Servers holds the nodes, index 0..n-1. Restart replaces an entry, so
	// do not read it concurrently with Restart. A node stopped with
	// Shutdown or Kill stays in the slice (Running() is false).
	Servers []*server.Server

	cfg  *config
	name string

	life sync.Mutex // serialises Shutdown, Kill, Restart and cleanup

	mu      sync.Mutex
	opts    []*server.Options // per node, with client and route ports pinned
	logs    []*tbLogger
	urls    []string
	proxies []*routeProxy // per node, in front of its route port
	killed  idSet         // server IDs of nodes stopped with Kill
	stopped bool          // final cleanup ran
}

// StartCluster starts an n-node JetStream cluster (use n = 3 for R3 streams)
// and waits until it has a JetStream meta leader that sees every node. Each
// node listens on 127.0.0.1 on a random free client port and a random free
// route port (see freePorts), lists every node's route port (so the
// cluster forms a full mesh and JetStream expects n peers), has a distinct
// server name and stores JetStream data in its own directory under
// t.TempDir(). All nodes are shut down when t ends. opts apply to every
// node.
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if n < 2 {
		t.Fatalf("natstest: StartCluster needs at least 2 nodes (use 3 for R3 streams), got %d", n)
	}
	cfg := newConfig(opts)
	c := &Cluster{cfg: cfg, name: "natstest-" + randomID()}
	// t.TempDir registers its removal on first use; do that before our own
	// cleanup is registered, so the nodes stop before their data is removed
	// (cleanups run last-in first-out).
	base := t.TempDir()
	t.Cleanup(c.cleanup)

	for attempt := 1; ; attempt++ {
		err := c.tryStart(t, n, filepath.Join(base, fmt.Sprintf("attempt%d", attempt)))
		if err == nil {
			break
		}
		c.stopAll()
		if errors.Is(err, errAddrInUse) && attempt < startAttempts {
			// Another process took one of the ports between the check
			// and the bind: pick new ports.
			t.Logf("natstest: %v; retrying with new ports", err)
			continue
		}
		t.Fatalf("natstest: starting %d-node cluster (attempt %d): %v", n, attempt, err)
	}
	c.WaitReady(t)
	return c
}

// tryStart starts every node once, on fresh client and route ports, with
// store directories under dir.
func (c *Cluster) tryStart(t testing.TB, n int, dir string) error {
	ports, err := freePorts(3 * n)
	if err != nil {
		return err
	}
	clientPorts, routePorts, proxyPorts := ports[:n], ports[n:2*n], ports[2*n:]

	// Route traffic goes through proxies (see proxy.go) so Kill can cut a
	// node off without it handing over its leaderships.
	proxies := make([]*routeProxy, 0, n)
	c.mu.Lock()
	c.proxies = proxies
	c.mu.Unlock()
	routes := make([]string, n)
	for i := range n {
		p, err := newRouteProxy(proxyPorts[i], routePorts[i], &c.killed)
		if err != nil {
			return err
		}
		proxies = append(proxies, p)
		c.mu.Lock()
		c.proxies = proxies
		c.mu.Unlock()
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", proxyPorts[i])
	}
	// Every node lists every node's route (proxy), itself included (the
	// server ignores its own route). The number of routes also tells
	// JetStream how many peers to expect in the meta group.
	routeURLs := server.RoutesFromStr(strings.Join(routes, ","))

	opts := make([]*server.Options, n)
	logs := make([]*tbLogger, n)
	srvs := make([]*server.Server, n)
	urls := make([]string, n)
	for i := range n {
		name := fmt.Sprintf("%s-n%d", c.name, i+1)
		storeDir := filepath.Join(dir, fmt.Sprintf("n%d", i+1))
		if err := os.MkdirAll(storeDir, 0o700); err != nil {
			return fmt.Errorf("natstest: creating store dir: %w", err)
		}
		o := newOptions(c.cfg, name, storeDir)
		// Fixed ports: Restart comes back on the same ones.
		o.Port = clientPorts[i]
		o.Cluster.Name = c.name
		o.Cluster.Host = "127.0.0.1"
		o.Cluster.Port = routePorts[i]
		// Tell the other nodes to reach this one through its proxy. As
		// the advertised address is a configured route, gossip never
		// makes them open a direct (unproxied) route.
		o.Cluster.Advertise = fmt.Sprintf("127.0.0.1:%d", proxyPorts[i])
		o.Routes = routeURLs
		opts[i] = o
		logs[i] = newLogger(t, c.cfg.logging, fmt.Sprintf("[n%d] ", i+1))
		urls[i] = clientURL(o.Port)
	}

	// Publish what we have so far so a failure below is cleaned up.
	c.mu.Lock()
	c.opts, c.logs, c.urls, c.Servers = opts, logs, urls, srvs
	c.mu.Unlock()

	for i := range n {
		srv, err := startServer(opts[i], logs[i], readyTimeout)
		if err != nil {
			return err
		}
		c.mu.Lock()
		srvs[i] = srv
		c.mu.Unlock()
	}
	return nil
}

func randomID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Name returns the cluster name.
func (c *Cluster) Name() string { return c.name }

// URL returns the client URL of node i. It stays the same across Restart.
func (c *Cluster) URL(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.urls[i]
}

// URLs returns the client URLs of all nodes, comma-separated, for
// nats.Connect. Stopped nodes are included; clients skip them.
func (c *Cluster) URLs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.urls, ",")
}

// URLsExcept returns the client URLs of all nodes except the given ones,
// comma-separated, e.g. to read through the surviving nodes only.
func (c *Cluster) URLsExcept(skip ...int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var urls []string
	for i, u := range c.urls {
		skipped := false
		for _, s := range skip {
			skipped = skipped || s == i
		}
		if !skipped {
			urls = append(urls, u)
		}
	}
	return strings.Join(urls, ",")
}

// Conn returns a client connection to the cluster (any node), closed when t
// ends. Like Server.Conn it carries the configured credentials and
// reconnects forever, so it survives node failures. opts are applied after
// the defaults.
func (c *Cluster) Conn(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, c.URLs(), c.cfg, opts)
}

// ConnTo is like Conn but only knows the given URLs (see URL, URLsExcept).
// The client may still learn other nodes from the cluster; pass
// nats.DontRandomize() or nats.IgnoreDiscoveredServers() if that matters.
func (c *Cluster) ConnTo(t testing.TB, urls string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return connect(t, urls, c.cfg, opts)
}

// JetStream returns a JetStream context on a new connection from Conn.
func (c *Cluster) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return newJetStream(t, c.Conn(t))
}

// Shutdown stops node i the way nats-server stops on SIGTERM or SIGINT:
// gracefully, first handing its raft leaderships (meta, streams, consumers)
// over to other nodes, so the cluster fails over almost at once. Its data
// stays on disk for Restart. Use Kill for a crash. Stopping a stopped node
// does nothing.
func (c *Cluster) Shutdown(i int) {
	c.life.Lock()
	defer c.life.Unlock()
	c.mu.Lock()
	srv := c.Servers[i]
	c.mu.Unlock()
	stopServer(srv)
}

// Kill stops node i as if its process crashed: all its route connections
// are cut first, so the other nodes get no leadership hand-over and only
// elect new leaders for what it led after their raft election timeout (4-9s
// in nats-server). Its clients are disconnected. Writes it had not
// replicated to a quorum are not acknowledged. Its data stays on disk for
// Restart (the in-process server still flushes its files on the way down,
// so a lost OS page cache is not simulated). Killing a stopped node does
// nothing.
func (c *Cluster) Kill(i int) {
	c.life.Lock()
	defer c.life.Unlock()
	c.mu.Lock()
	srv, proxies := c.Servers[i], c.proxies
	c.mu.Unlock()
	if srv == nil || !srv.Running() {
		return
	}
	id := srv.ID()
	c.killed.add(id)
	proxies[i].setDown(true)
	for j, p := range proxies {
		if j != i {
			p.dropFrom(id)
		}
	}
	stopServer(srv)
}

// Restart stops node i if it is running (gracefully, see Shutdown), starts
// it again with the same name, ports and store directory, and waits until
// it has rejoined the cluster (see WaitReady). Streams it holds catch up
// from the other nodes afterwards; use WaitStreamCurrent to wait for that.
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	c.life.Lock()
	c.mu.Lock()
	stopped, old, opts, log, proxy := c.stopped, c.Servers[i], c.opts[i], c.logs[i], c.proxies[i]
	c.mu.Unlock()
	if stopped {
		c.life.Unlock()
		t.Fatalf("natstest: Restart after the test's cleanup")
	}
	stopServer(old)
	proxy.setDown(false)
	srv, err := restartServer(opts, log)
	if err != nil {
		c.life.Unlock()
		t.Fatal(err)
	}
	c.mu.Lock()
	c.Servers[i] = srv
	c.mu.Unlock()
	c.life.Unlock()
	c.WaitReady(t)
}

// running returns the running nodes with their indexes.
func (c *Cluster) running() (idx []int, srvs []*server.Server) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.Servers {
		if s != nil && s.Running() {
			idx = append(idx, i)
			srvs = append(srvs, s)
		}
	}
	return idx, srvs
}

// MetaLeader returns the index of the node that currently is the JetStream
// meta leader, or -1.
func (c *Cluster) MetaLeader() int {
	idx, srvs := c.running()
	for k, s := range srvs {
		if s.JetStreamIsLeader() {
			return idx[k]
		}
	}
	return -1
}

// StreamLeader returns the index of the node that currently leads stream
// (in the default account), or -1.
func (c *Cluster) StreamLeader(stream string) int {
	idx, srvs := c.running()
	for k, s := range srvs {
		if s.JetStreamIsStreamLeader(globalAccount, stream) {
			return idx[k]
		}
	}
	return -1
}

// WaitReady waits until the cluster has a JetStream meta leader that knows
// every running node and every running node is current with the meta
// group; it fails the test after 30s. StartCluster and Restart call it.
func (c *Cluster) WaitReady(t testing.TB) {
	t.Helper()
	var last string
	deadline := time.Now().Add(clusterReadyTimeout)
	for time.Now().Before(deadline) {
		if last = c.notReady(); last == "" {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("natstest: cluster %s not ready after %s: %s; recent errors: %s",
		c.name, clusterReadyTimeout, last, c.recentErrors())
}

// notReady returns why the cluster is not ready, or "".
func (c *Cluster) notReady() string {
	_, srvs := c.running()
	if len(srvs) == 0 {
		return "no node is running"
	}
	var leader *server.Server
	for _, s := range srvs {
		if s.JetStreamIsLeader() {
			leader = s
		}
	}
	if leader == nil {
		return "no JetStream meta leader"
	}
	if peers := leader.JetStreamClusterPeers(); len(peers) < len(srvs) {
		return fmt.Sprintf("meta leader %s sees %d of %d running nodes", leader.Name(), len(peers), len(srvs))
	}
	for _, s := range srvs {
		if !s.JetStreamIsCurrent() {
			return fmt.Sprintf("node %s is not current with the meta group", s.Name())
		}
	}
	return ""
}

// WaitStreamCurrent waits until stream (in the default account) has a
// leader and every running node holding a replica of it is current, e.g.
// after Restart; it fails the test after 30s.
func (c *Cluster) WaitStreamCurrent(t testing.TB, stream string) {
	t.Helper()
	var last string
	deadline := time.Now().Add(clusterReadyTimeout)
	for time.Now().Before(deadline) {
		if last = c.streamNotCurrent(stream); last == "" {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("natstest: stream %q not current after %s: %s", stream, clusterReadyTimeout, last)
}

func (c *Cluster) streamNotCurrent(stream string) string {
	_, srvs := c.running()
	hasLeader := false
	for _, s := range srvs {
		if s.JetStreamIsStreamLeader(globalAccount, stream) {
			hasLeader = true
		}
		if s.JetStreamIsStreamAssigned(globalAccount, stream) && !s.JetStreamIsStreamCurrent(globalAccount, stream) {
			return fmt.Sprintf("replica on %s is not current", s.Name())
		}
	}
	if !hasLeader {
		return "no stream leader"
	}
	return ""
}

func (c *Cluster) recentErrors() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	parts := make([]string, 0, len(c.logs))
	for i, l := range c.logs {
		parts = append(parts, fmt.Sprintf("n%d: %s", i+1, l.recentErrors()))
	}
	return strings.Join(parts, " | ")
}

// stopAll shuts every node down, then the route proxies.
func (c *Cluster) stopAll() {
	c.mu.Lock()
	srvs := append([]*server.Server(nil), c.Servers...)
	proxies := c.proxies
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range srvs {
		if s != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stopServer(s)
			}()
		}
	}
	wg.Wait()
	for _, p := range proxies {
		p.close()
	}
}

func (c *Cluster) cleanup() {
	c.life.Lock()
	defer c.life.Unlock()
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.stopAll()
	c.mu.Lock()
	logs := c.logs
	c.mu.Unlock()
	for _, l := range logs {
		l.close()
	}
}
