package sdktest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/internal/projector"
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
	return newLedgerWith(t, fence.Config{})
}

// newLedgerWith is newLedger with the store configured by cfg (such as
// its partition count).
func newLedgerWith(t *testing.T, cfg fence.Config) *ledger {
	t.Helper()
	l := &ledger{t: t, db: dbtest.New(t), ns: natstest.Start(t)}
	var err error
	l.store, err = fence.New(l.db.Pool, cfg)
	require.NoError(t, err)
	svc, err := ingest.New(ingest.Config{}, ingest.Deps{NC: l.ns.Conn(t), Store: l.store, Logger: ledgertest.Logger()})
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
		nc = l.ns.Conn(l.t, worker.InboxOption(cfg.Holder))
	}
	return newClient(l.t, nc, cfg)
}

func newClient(t *testing.T, nc *nats.Conn, cfg worker.Config) *worker.Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = ledgertest.Logger()
	}
	c, err := worker.New(nc, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
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
	return ledgertest.Count(l.t, l.db.Pool, sql, args...)
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

// startProjector runs a projector on the ledger until the test ends, so
// that ledger_tasks follows the committed log.
func (l *ledger) startProjector() {
	l.t.Helper()
	p, err := projector.New(projector.Config{}, projector.Deps{NC: l.ns.Conn(l.t), Pool: l.db.Pool, Logger: ledgertest.Logger()})
	require.NoError(l.t, err)
	require.NoError(l.t, p.Start(context.Background()))
	l.t.Cleanup(p.Stop)
}

// recorder is a slog.Handler that keeps every record, so a test can tell
// when the SDK did something it only logs.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// count is how many records whose message starts with prefix were logged
// after since.
func (r *recorder) count(prefix string, since time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if strings.HasPrefix(rec.Message, prefix) && rec.Time.After(since) {
			n++
		}
	}
	return n
}

// String lists the records, for a failure message.
func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, rec := range r.recs {
		fmt.Fprintf(&b, "%s %s %s", rec.Time.Format("15:04:05.000"), rec.Level, rec.Message)
		rec.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		b.WriteByte('\n')
	}
	return b.String()
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// writeBehind publishes version of task under lease (as holder, with its
// generation) from outside the client, as another writer under the same
// lease would, and waits until the ledger has committed it.
func (l *ledger) writeBehind(ctx context.Context, lease *worker.Lease, holder, task string, version int64) {
	l.t.Helper()
	m := wire.Subjects{}.InboundMsg(wire.Inbound{ID: ledgertest.NewID(), Partition: lease.Partition(), Task: task,
		Holder: holder, Generation: lease.Generation(), Version: version, Type: "elsewhere"})
	_, err := l.ns.JetStream(l.t).PublishMsg(ctx, m)
	require.NoError(l.t, err)
	require.Eventually(l.t, func() bool { return int64(len(l.events(task))) == version }, 10*time.Second, 10*time.Millisecond)
}

// lockLease holds partition's lease row locked (SELECT ... FOR UPDATE) in
// a transaction of its own, as a long batch of the ingest would: the lease
// service and the fenced append of the partition wait for it. The lock
// goes with the transaction; a test that does not end it earlier has it
// rolled back when the test ends.
func (l *ledger) lockLease(ctx context.Context, partition int) pgx.Tx {
	l.t.Helper()
	tx, err := l.db.Pool.Begin(ctx)
	require.NoError(l.t, err)
	l.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, `SELECT 1 FROM ledger.leases WHERE partition = $1 FOR UPDATE`, partition)
	require.NoError(l.t, err)
	return tx
}

// partitionOf is the partition task is pinned to.
func (l *ledger) partitionOf(ctx context.Context, task string) int {
	l.t.Helper()
	var p int
	require.NoError(l.t, l.db.Pool.QueryRow(ctx, `SELECT partition FROM ledger.events WHERE task_id = $1 AND version = 1`, task).Scan(&p))
	return p
}
