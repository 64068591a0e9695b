// Package natstest runs real, in-process NATS JetStream servers for tests:
// no mocks.
//
// Every server listens on 127.0.0.1 on a random free port (see ports.go for
// how it is chosen) and keeps its JetStream data in a directory under
// t.TempDir(), so tests never touch a NATS server that happens to run on the
// machine (for example on the default port 4222) and never share state with
// each other. Servers are shut down when the test ends. Everything is safe
// for parallel tests.
//
//	srv := natstest.Start(t)            // standalone server
//	js := srv.JetStream(t)
//	srv.Restart(t)                      // same port and data
//
//	c := natstest.StartCluster(t, 3)    // 3-node JetStream cluster
//	js := c.JetStream(t)
//	i := c.StreamLeader("EVENTS")
//	c.Kill(i)                           // crash a node (or c.Shutdown(i))
//	c.Restart(t, i)
package natstest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// readyTimeout bounds how long a single server may take to open its
	// listeners after Start.
	readyTimeout = 10 * time.Second

	// startAttempts is how often Start and StartCluster try new ports when
	// a port was taken between the check and the server's bind.
	startAttempts = 5

	// rebindTimeout is how long Restart keeps retrying while its port is
	// (transiently) in use.
	rebindTimeout = 3 * time.Second

	// Default JetStream limits. They are explicit so that the server does not
	// size them from the machine's free memory and disk.
	defaultMaxMemory = 256 << 20 // 256 MiB
	defaultMaxStore  = 8 << 30   // 8 GiB: room for the streams' reservations (LEDGER_DLQ takes 1 GiB)
)

// Option configures the servers started by Start and StartCluster.
type Option func(*config)

type config struct {
	logging  bool
	user     string
	password string
	mods     []func(*server.Options)
}

func newConfig(opts []Option) *config {
	cfg := &config{}
	for _, o := range opts {
		if o != nil {
			o(cfg)
		}
	}
	return cfg
}

// apply writes the configured settings onto o.
func (c *config) apply(o *server.Options) {
	if c.user != "" || c.password != "" {
		o.Username = c.user
		o.Password = c.password
	}
	for _, m := range c.mods {
		m(o)
	}
}

// clientOptions are the nats.go options Conn uses before the caller's own.
func (c *config) clientOptions() []nats.Option {
	opts := []nats.Option{
		nats.Name("natstest"),
		// Keep reconnecting for as long as the test runs, and quickly, so
		// that restarts and node failures are survived by open connections.
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
		nats.Timeout(2 * time.Second),
	}
	if c.user != "" || c.password != "" {
		opts = append(opts, nats.UserInfo(c.user, c.password))
	}
	return opts
}

// WithLogging sends the server's log (notices, warnings and errors; no debug
// or protocol trace) to t.Log. By default the servers log nothing.
func WithLogging() Option {
	return func(c *config) { c.logging = true }
}

// WithMaxPayload sets the largest message payload the server accepts.
func WithMaxPayload(n int32) Option {
	return func(c *config) {
		c.mods = append(c.mods, func(o *server.Options) { o.MaxPayload = n })
	}
}

// WithUserPassword requires clients to authenticate with user and password.
// Connections made with Conn (and JetStream) pass these credentials
// automatically; plain nats.Connect to URL() without them is refused.
func WithUserPassword(user, password string) Option {
	return func(c *config) {
		c.user = user
		c.password = password
	}
}

// WithOptions lets a test change server options not covered by the other
// Options, e.g. JetStreamMaxStore (default 8 GiB) or JetStreamMaxMemory
// (default 256 MiB). fn runs once per server, after the defaults. The
// package still sets ServerName, Host, Port, NoSigs, JetStream and
// StoreDir, and for cluster nodes Cluster.Name, Cluster.Host, Cluster.Port
// and Routes, overriding fn.
func WithOptions(fn func(*server.Options)) Option {
	return func(c *config) {
		if fn != nil {
			c.mods = append(c.mods, fn)
		}
	}
}

// newOptions returns the options for a server: package defaults, then the
// configured Options, then the fields this package owns. The caller sets
// Port (and for cluster nodes the cluster fields and Routes).
func newOptions(cfg *config, name, storeDir string) *server.Options {
	o := &server.Options{
		NoLog:              true,
		JetStreamMaxMemory: defaultMaxMemory,
		JetStreamMaxStore:  defaultMaxStore,
	}
	cfg.apply(o)
	o.ServerName = name
	o.Host = "127.0.0.1"
	o.NoSigs = true
	o.JetStream = true
	o.StoreDir = storeDir
	return o
}

// errAddrInUse reports that a listener could not bind its port.
var errAddrInUse = errors.New("address already in use")

// startServer creates and starts a server from a copy of o and waits until
// its listeners are open. On failure the server is shut down again.
func startServer(o *server.Options, log *tbLogger, timeout time.Duration) (*server.Server, error) {
	srv, err := server.NewServer(o.Clone())
	if err != nil {
		return nil, fmt.Errorf("natstest: creating server %q: %w", o.ServerName, err)
	}
	log.resetFatal()
	srv.SetLoggerV2(log, false, false, false)
	srv.Start()

	deadline := time.Now().Add(timeout)
	for {
		// A failing listener is reported with Fatalf, which our logger
		// records instead of exiting the process: fail fast on it.
		if msg := log.fatal(); msg != "" {
			stopServer(srv)
			err := fmt.Errorf("natstest: server %q failed to start: %s", o.ServerName, msg)
			if strings.Contains(msg, "address already in use") {
				err = fmt.Errorf("%w (%w)", err, errAddrInUse)
			}
			return nil, err
		}
		if srv.ReadyForConnections(100 * time.Millisecond) {
			return srv, nil
		}
		if time.Now().After(deadline) {
			stopServer(srv)
			return nil, fmt.Errorf("natstest: server %q not ready for connections after %s; recent errors: %s",
				o.ServerName, timeout, log.recentErrors())
		}
	}
}

// restartServer is startServer for a server that ran on the same ports
// before: it retries for a short while if a port is still in use.
func restartServer(o *server.Options, log *tbLogger) (*server.Server, error) {
	deadline := time.Now().Add(rebindTimeout)
	for {
		srv, err := startServer(o, log, readyTimeout)
		if err == nil || !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			return srv, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func stopServer(srv *server.Server) {
	if srv == nil {
		return
	}
	srv.Shutdown()
	srv.WaitForShutdown()
}

func clientURL(port int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", port)
}

// connect opens a client connection that is closed when t ends.
func connect(t testing.TB, url string, cfg *config, opts []nats.Option) *nats.Conn {
	t.Helper()
	if url == "" {
		// nats.Connect("") would silently dial the default port 4222.
		t.Fatalf("natstest: no server URL to connect to")
	}
	nc, err := nats.Connect(url, append(cfg.clientOptions(), opts...)...)
	if err != nil {
		t.Fatalf("natstest: connecting to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func newJetStream(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: creating JetStream context: %v", err)
	}
	return js
}

// Server is a single embedded NATS server with JetStream enabled.
type Server struct {
	cfg *config
	log *tbLogger

	life sync.Mutex // serialises Restart and cleanup

	mu      sync.Mutex
	opts    *server.Options // template for (re)starts, with the client port pinned
	srv     *server.Server
	url     string
	conns   []*nats.Conn // from Conn, waited for on Restart
	stopped bool         // final cleanup ran
}

// Start starts a standalone JetStream server on 127.0.0.1, on a random free
// client port (see freePorts for how it is chosen) and with a store
// directory under t.TempDir(), waits until it accepts connections and
// registers its shutdown with t.Cleanup. It fails the test if the server
// cannot be started.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	cfg := newConfig(opts)
	// t.TempDir registers its removal on first use; do that before our own
	// cleanup is registered, so the server stops before its data is removed
	// (cleanups run last-in first-out).
	o := newOptions(cfg, "natstest", t.TempDir())

	s := &Server{cfg: cfg, log: newLogger(t, cfg.logging, "")}
	t.Cleanup(s.cleanup)

	var srv *server.Server
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		// Restarts come back on this port, so URL() stays valid and open
		// connections reconnect.
		o.Port = ports[0]
		srv, err = startServer(o, s.log, readyTimeout)
		if err == nil {
			break
		}
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			t.Fatal(err)
		}
	}

	s.mu.Lock()
	s.opts, s.srv, s.url = o, srv, clientURL(o.Port)
	s.mu.Unlock()
	return s
}

// URL returns the client URL, nats://127.0.0.1:<port>. It stays the same
// across Restart.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// StoreDir returns the JetStream store directory.
func (s *Server) StoreDir() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.StoreDir
}

// Server returns the running nats-server. It changes on Restart.
func (s *Server) Server() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Conn returns a client connection to the server, closed when t ends. It
// carries the credentials of WithUserPassword and reconnects forever (every
// 50ms), so it survives Restart. opts are applied after these defaults.
func (s *Server) Conn(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc := connect(t, s.URL(), s.cfg, opts)
	s.mu.Lock()
	s.conns = append(s.conns, nc)
	s.mu.Unlock()
	return nc
}

// JetStream returns a JetStream context on a new connection from Conn.
func (s *Server) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return newJetStream(t, s.Conn(t))
}

// Shutdown stops the server and waits until it has stopped. JetStream data
// is flushed and kept, so Restart brings it back. Calling it on a stopped
// server does nothing.
func (s *Server) Shutdown() {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	stopServer(srv)
}

// Restart shuts the server down (if it is running) and starts a new one with
// the same options, client port and store directory, so streams and their
// messages survive. Shutdown is graceful (JetStream flushes its files): an
// in-process server cannot be killed like a crashed process.
//
// Restart returns once the server accepts connections and every open
// connection made with Conn has reconnected to it. Without that wait a
// request sent right after Restart could go out on the old, dead socket
// (before the client noticed the disconnect) and be lost. Tests that want
// that realistic window should use their own nats.Connect.
//
// It fails the test if the server cannot be started again (e.g. another
// process took the port meanwhile) or a connection does not reconnect
// within 10s.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.life.Lock()
	defer s.life.Unlock()
	s.mu.Lock()
	stopped, old, opts := s.stopped, s.srv, s.opts
	conns := append([]*nats.Conn(nil), s.conns...)
	s.mu.Unlock()
	if stopped {
		t.Fatalf("natstest: Restart after the test's cleanup")
	}
	reconnects := make([]uint64, len(conns))
	for i, nc := range conns {
		reconnects[i] = nc.Stats().Reconnects
	}

	stopServer(old)
	srv, err := restartServer(opts, s.log)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()

	deadline := time.Now().Add(readyTimeout)
	for i, nc := range conns {
		for !nc.IsClosed() && !(nc.IsConnected() && nc.Stats().Reconnects > reconnects[i]) {
			if time.Now().After(deadline) {
				t.Fatalf("natstest: client connection %d did not reconnect within %s after restart (status %v, last error %v)",
					i+1, readyTimeout, nc.Status(), nc.LastError())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func (s *Server) cleanup() {
	s.life.Lock()
	defer s.life.Unlock()
	s.mu.Lock()
	s.stopped = true
	srv := s.srv
	s.mu.Unlock()
	stopServer(srv)
	s.log.close()
}
