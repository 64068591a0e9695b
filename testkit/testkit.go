// Package testkit starts a whole ledger inside a Go test, for adopters who
// test their workers against the real thing: an embedded NATS server with
// JetStream, the ingest (with the lease service) and the projector running
// in the test's process, on a PostgreSQL database of the test's own.
//
//	l := testkit.Start(t, testkit.Options{})
//	nc := l.Connect(t, worker.InboxOption("reports.a"))
//	receipts := l.Receipts(t, "reports.a") // before the first publish
//	... run your worker on nc ...
//	r := receipts.Wait(t, eventID)          // its verdict
//	s := l.WaitProjection(t, "report-7", func(s projection.State) bool { return s.Version == 3 })
//	l.ForceTakeover(t, partition)           // the holder's lease expires now
//
// PostgreSQL is TEST_DATABASE_URL (default postgres://root@127.0.0.1:5432/test):
// each Start makes a fresh, migrated database there and drops it when the
// test ends. Everything Start makes is stopped by t.Cleanup.
package testkit

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// Defaults of Options.
const (
	// GapWindowDefault is the ingest's gap window in a test: 2 s, so a
	// test of a gap does not wait the deployment default's 30 s.
	GapWindowDefault = 2 * time.Second
	// WaitDefault bounds each Wait: 10 s.
	WaitDefault = 10 * time.Second
)

// Options configure a test's ledger.
type Options struct {
	// Partitions is the partition count; default 16.
	Partitions int
	// GapWindow is how long an event ahead of its task's head waits for
	// the versions before it; default GapWindowDefault.
	GapWindow time.Duration
}

// Ledger is a running ledger of one test.
type Ledger struct {
	// NATSURL is the embedded NATS server's URL.
	NATSURL string
	// DatabaseURL connects to the test's database; Pool is a pool on it.
	DatabaseURL string
	Pool        *pgxpool.Pool
	ns          *natstest.Server
	nc          *nats.Conn
}

// Start starts a ledger for t: a fresh database, an embedded NATS server,
// the ingest and the projector. It fails t if any of them cannot start.
func Start(t testing.TB, o Options) *Ledger {
	t.Helper()
	db := dbtest.New(t)
	ns := natstest.Start(t)
	store, err := fence.New(db.Pool, fence.Config{Partitions: o.Partitions})
	if err != nil {
		t.Fatalf("testkit: fence: %v", err)
	}
	gap := o.GapWindow
	if gap == 0 {
		gap = GapWindowDefault
	}
	log := ledgertest.Logger() // quiet unless LEDGER_TEST_LOG is set
	in, err := ingest.New(ingest.Config{GapWindow: gap}, ingest.Deps{NC: ns.Conn(t), Store: store, Logger: log})
	if err != nil {
		t.Fatalf("testkit: ingest: %v", err)
	}
	if err := in.Start(context.Background()); err != nil {
		t.Fatalf("testkit: start the ingest: %v", err)
	}
	t.Cleanup(in.Stop)
	pr, err := projector.New(projector.Config{}, projector.Deps{NC: ns.Conn(t), Pool: db.Pool, Logger: log})
	if err != nil {
		t.Fatalf("testkit: projector: %v", err)
	}
	if err := pr.Start(context.Background()); err != nil {
		t.Fatalf("testkit: start the projector: %v", err)
	}
	t.Cleanup(pr.Stop)
	return &Ledger{NATSURL: ns.URL(), DatabaseURL: db.URL, Pool: db.Pool, ns: ns, nc: ns.Conn(t)}
}

// Connect opens a connection to the ledger's NATS server with opts (a
// worker's worker.InboxOption, say), closed when the test ends.
func (l *Ledger) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return l.ns.Conn(t, opts...)
}

// Receipts collects the receipts of one holder from the moment it is made:
// make it before the holder's first publish.
type Receipts struct {
	mu   sync.Mutex
	byID map[string]wire.Receipt
	more chan struct{}
}

// Receipts subscribes to holder's receipts until the test ends.
func (l *Ledger) Receipts(t testing.TB, holder string) *Receipts {
	t.Helper()
	r := &Receipts{byID: map[string]wire.Receipt{}, more: make(chan struct{})}
	sub, err := l.nc.Subscribe(wire.Subjects{Prefix: wire.PrefixDefault}.Receipt(holder), func(m *nats.Msg) {
		rs, err := wire.ReceiptsOf(m.Header, m.Data) // the SDK's batches get batched receipts
		if err != nil {
			return
		}
		r.mu.Lock()
		for _, rc := range rs {
			if _, ok := r.byID[rc.EventID]; !ok {
				r.byID[rc.EventID] = rc
			}
		}
		close(r.more)
		r.more = make(chan struct{})
		r.mu.Unlock()
	})
	if err == nil {
		err = l.nc.Flush()
	}
	if err != nil {
		t.Fatalf("testkit: subscribe to the receipts of %s: %v", holder, err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return r
}

// Wait returns the first receipt of event id, waiting up to WaitDefault.
func (r *Receipts) Wait(t testing.TB, id string) wire.Receipt {
	t.Helper()
	deadline := time.After(WaitDefault)
	for {
		r.mu.Lock()
		rc, ok := r.byID[id]
		more := r.more
		r.mu.Unlock()
		if ok {
			return rc
		}
		select {
		case <-more:
		case <-deadline:
			t.Fatalf("testkit: no receipt of event %s within %v", id, WaitDefault)
		}
	}
}

// WaitProjection returns task's projection once done(value) holds, reading
// it as a confined reader does (direct get), up to WaitDefault.
func (l *Ledger) WaitProjection(t testing.TB, task string, done func(projection.State) bool) projection.State {
	t.Helper()
	deadline := time.Now().Add(WaitDefault)
	last := "no value"
	for time.Now().Before(deadline) {
		m, err := l.nc.Request("$JS.API.DIRECT.GET.KV_"+wire.BucketTasks+".$KV."+wire.BucketTasks+"."+task, nil, time.Second)
		if err == nil && m.Header.Get("Status") == "" {
			var s projection.State
			if err := json.Unmarshal(m.Data, &s); err != nil {
				last = err.Error()
			} else if done(s) {
				return s
			} else {
				last = string(m.Data)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("testkit: projection of %s not as wanted within %v; last: %s", task, WaitDefault, last)
	return projection.State{}
}

// ForceTakeover makes partition's lease expire now, as if its holder had
// stopped renewing a TTL ago: the next acquire, by any holder, takes it
// with the next generation, and the old holder's writes come back stale.
func (l *Ledger) ForceTakeover(t testing.TB, partition int) {
	t.Helper()
	tag, err := l.Pool.Exec(context.Background(),
		`UPDATE ledger.leases SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE partition = $1`, partition)
	if err != nil {
		t.Fatalf("testkit: expire the lease of partition %d: %v", partition, err)
	}
	if tag.RowsAffected() != 1 {
		t.Fatalf("testkit: partition %d was never leased", partition)
	}
}
