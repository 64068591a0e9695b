package worker_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// ledger is one test's running ledger: its own database, an embedded NATS
// server and an ingest service (with the lease service) on them.
type ledger struct {
	t     *testing.T
	db    *dbtest.DB
	store *fence.Store
	ns    *natstest.Server
}

func newLedger(t *testing.T) *ledger {
	t.Helper()
	l := &ledger{t: t, db: dbtest.New(t), ns: natstest.Start(t)}
	var err error
	l.store, err = fence.New(l.db.Pool, fence.Config{})
	require.NoError(t, err)
	svc, err := ingest.New(ingest.Config{}, ingest.Deps{NC: l.ns.Conn(t), Store: l.store, Logger: testLogger()})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	return l
}

// client returns a worker client on nc (a new connection if nil), closed
// when the test ends.
func (l *ledger) client(nc *nats.Conn, cfg worker.Config) *worker.Client {
	l.t.Helper()
	if nc == nil {
		nc = l.ns.Conn(l.t)
	}
	return newClient(l.t, nc, cfg)
}

func newClient(t *testing.T, nc *nats.Conn, cfg worker.Config) *worker.Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	c, err := worker.New(nc, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

func testLogger() *slog.Logger {
	if os.Getenv("LEDGER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// row is one row of ledger.events, as a test compares it.
type row struct {
	Task       string
	Version    int64
	EventID    string
	Holder     string
	Generation int64
	Type       string
}

func (l *ledger) events(task string) []row {
	l.t.Helper()
	rows, err := l.db.Pool.Query(context.Background(),
		`SELECT task_id, version, event_id, holder, generation, type FROM ledger.events WHERE task_id = $1 ORDER BY version`, task)
	require.NoError(l.t, err)
	defer rows.Close()
	var out []row
	for rows.Next() {
		var r row
		require.NoError(l.t, rows.Scan(&r.Task, &r.Version, &r.EventID, &r.Holder, &r.Generation, &r.Type))
		out = append(out, r)
	}
	require.NoError(l.t, rows.Err())
	return out
}

func (l *ledger) count(sql string, args ...any) int {
	l.t.Helper()
	var n int
	require.NoError(l.t, l.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// leaseGet calls <prefix>.lease.get, as any client of the contract would.
func leaseGet(t *testing.T, nc *nats.Conn, partition int) wire.LeaseReply {
	t.Helper()
	b, _ := json.Marshal(wire.LeaseRequest{Partition: &partition})
	resp, err := nc.Request(wire.Subjects{}.LeaseGet(), b, 5*time.Second)
	require.NoError(t, err)
	require.Empty(t, resp.Header.Get("Nats-Service-Error-Code"), string(resp.Data))
	var r wire.LeaseReply
	require.NoError(t, json.Unmarshal(resp.Data, &r))
	require.NotNil(t, r.Valid)
	return r
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// blackhole is a TCP proxy that can silently stop forwarding: after Cut,
// both directions are read and dropped, and the connections stay open, so
// the client behind it notices nothing but silence (the harshest way for a
// lease holder to lose its service).
type blackhole struct {
	ln     net.Listener
	target string
	cut    atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b := &blackhole{ln: ln, target: target}
	b.wg.Add(1)
	go b.accept()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) URL() string { return "nats://" + b.ln.Addr().String() }

// Cut stops forwarding in both directions, for good.
func (b *blackhole) Cut() { b.cut.Store(true) }

func (b *blackhole) accept() {
	defer b.wg.Done()
	for {
		client, err := b.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", b.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, client, server)
		b.mu.Unlock()
		b.wg.Add(2)
		go b.pipe(server, client)
		go b.pipe(client, server)
	}
}

func (b *blackhole) pipe(dst, src net.Conn) {
	defer b.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.cut.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil { // either side closed: close the other
			_ = src.Close()
			_ = dst.Close()
			return
		}
	}
}

func (b *blackhole) close() {
	_ = b.ln.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}
