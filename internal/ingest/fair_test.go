package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/pkg/wire"
)

// One principal flooding the lease service (junk renewals on its own
// subject) and the task head lookups leaves another principal's renewals
// and commits as fast as without the flood: p99 within twice the quiet
// run's, measured in the same test. The flood is refused at once
// (rate_limited, busy), never reaches PostgreSQL beyond its share, and is
// counted per principal on /metrics.
//
// Quiet and flooded windows alternate, so the machine's own load weighs on
// both alike. Before the fair queue, the service answered one request at a
// time: the flood's backlog grew by thousands a second and the quiet
// principal's renewals waited behind it.
func TestFloodOfOnePrincipalLeavesAnothersLatency(t *testing.T) {
	// A share of 100 requests a second, with a burst wide enough for the
	// quiet principal's windows (it averages under 70 a second).
	e, reg := newMeteredEnv(t, ingest.Config{LeaseRate: 100, LeaseBurst: 1000})
	const quiet, flooder = "reports.a", "billing.x"
	lease := e.acquire(1, quiet, 60000)
	e.acquire(2, flooder, 60000)

	// The quiet principal's commits: publish, then wait for the receipt.
	receipts := map[string]chan struct{}{}
	var mu sync.Mutex
	sub, err := e.nc.Subscribe(e.subj.Receipt(quiet), func(m *nats.Msg) {
		var r wire.Receipt
		if json.Unmarshal(m.Data, &r) == nil && r.Verdict == wire.VerdictCommitted {
			mu.Lock()
			if ch := receipts[r.EventID]; ch != nil {
				close(ch)
				delete(receipts, r.EventID)
			}
			mu.Unlock()
		}
	})
	require.NoError(t, err)
	defer sub.Unsubscribe() //nolint:errcheck
	qc := e.ns.Conn(t)
	version := int64(0)
	commit := func() time.Duration {
		version++
		id := newID()
		ch := make(chan struct{})
		mu.Lock()
		receipts[id] = ch
		mu.Unlock()
		start := time.Now()
		e.publish(event{id: id, partition: 1, task: "report-1", holder: quiet, generation: lease.Generation,
			version: version, typ: "step", payload: `{}`})
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("no committed receipt for version %d", version)
		}
		return time.Since(start)
	}
	renewBody := fmt.Appendf(nil, `{"partition":1,"generation":%d}`, lease.Generation)
	renew := func() time.Duration {
		start := time.Now()
		resp, err := qc.Request(e.subj.Lease(wire.LeaseRenew, quiet), renewBody, 30*time.Second)
		d := time.Since(start)
		require.NoError(t, err)
		require.Empty(t, resp.Header.Get("Nats-Service-Error-Code"), "renewal refused: %s", resp.Data)
		return d
	}

	// The flood: junk renewals of billing's own lease and task head
	// lookups from its inbox, 2,000 a second each (300 under the race
	// detector), several times its share and more than one request at a
	// time can serve; answers dropped. A faster flood measures this
	// machine's CPUs, not the service.
	fc := e.ns.Conn(t)
	var refused, answers atomic.Int64
	fsub, err := fc.Subscribe("_INBOX.billing.>", func(m *nats.Msg) {
		answers.Add(1)
		if c := m.Header.Get("Nats-Service-Error-Code"); c == "429" {
			refused.Add(1)
		}
	})
	require.NoError(t, err)
	defer fsub.Unsubscribe() //nolint:errcheck
	perTick := 20
	if raceEnabled {
		perTick = 3 // the same flood, for a process the detector slows
	}
	var flooding atomic.Bool
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		junk := []byte(`{"partition":2,"generation":999999}`)
		head := []byte(`{"task":"report-1"}`)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if !flooding.Load() {
				continue
			}
			for i := range perTick {
				inbox := fmt.Sprintf("_INBOX.billing.%d.%d", n, i)
				_ = fc.PublishRequest(e.subj.Lease(wire.LeaseRenew, flooder), inbox, junk)
				_ = fc.PublishRequest(e.subj.TaskHead(), inbox+"h", head)
			}
		}
	}()

	window := func(renews, commits *[]time.Duration) {
		for i := range 40 {
			*renews = append(*renews, renew())
			if i%2 == 0 {
				*commits = append(*commits, commit())
			}
		}
	}
	// One round: eight quiet windows and eight flooded ones, alternating.
	// A loaded machine's own pauses can still land in one run's tail, so
	// the claim holds if one of three rounds shows it; without the fair
	// queue every round is several times slower under the flood.
	round := func() bool {
		var calm, flood struct{ renew, commit []time.Duration }
		window(&calm.renew, &calm.commit) // warm up, not counted
		calm.renew, calm.commit = nil, nil
		for range 8 {
			window(&calm.renew, &calm.commit)
			flooding.Store(true)
			time.Sleep(100 * time.Millisecond) // the flood's backlog builds first
			window(&flood.renew, &flood.commit)
			flooding.Store(false)
		}
		held := true
		for _, m := range []struct {
			what        string
			calm, flood []time.Duration
		}{{"renewal", calm.renew, flood.renew}, {"commit", calm.commit, flood.commit}} {
			c, f := p99(m.calm), p99(m.flood)
			t.Logf("%s p99: %v quiet, %v while another principal floods (%.2fx; %d and %d samples)",
				m.what, c, f, float64(f)/float64(c), len(m.calm), len(m.flood))
			held = held && f <= 2*c
		}
		return held
	}
	held := false
	for r := 0; r < 3 && !held; r++ {
		held = round()
	}
	// The flood outruns its share (renewals and reads each have a burst of
	// 1,000) within seconds of the rounds, if not during them; it runs on
	// until it is refused.
	// It runs until both of its paths were refused: on a quiet machine the
	// first refusal can come a moment before the other path's.
	flooding.Store(true)
	require.Eventually(t, func() bool {
		c := refusals(t, reg)
		return refused.Load() > 0 && c["renew/billing"] > 0 && c["task_head/billing"] > 0
	}, 60*time.Second, 50*time.Millisecond, "the flood was never refused at once on both paths")
	stop()
	<-done
	require.True(t, held, "renewal and commit p99 within twice the quiet run's while another principal floods")
	t.Logf("flood: %d answers, %d refused at once", answers.Load(), refused.Load())

	// Every refusal is counted under the flooding principal.
	counted := refusals(t, reg)
	require.Positive(t, counted["renew/billing"], "refused renewals counted: %v", counted)
	require.Positive(t, counted["task_head/billing"], "refused lookups counted: %v", counted)
	require.Zero(t, counted["renew/reports"]+counted["task_head/reports"], "the quiet principal was never refused")
}

// newMeteredEnv is newEnv with the ingest's metrics in a registry.
func newMeteredEnv(t *testing.T, cfg ingest.Config) (*env, *prometheus.Registry) {
	t.Helper()
	e := newBareEnv(t)
	reg := prometheus.NewRegistry()
	svc, err := ingest.New(cfg, ingest.Deps{NC: e.ns.Conn(t), Store: e.store, Logger: ledgertest.Logger(), Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	e.svc = svc
	return e, reg
}

// refusals reads ledger_refusals_total as "path/principal" → count.
func refusals(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "ledger_refusals_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[labels["path"]+"/"+labels["principal"]] += m.GetCounter().GetValue()
		}
	}
	return out
}

func p99(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)*99)/100]
}

// A principal's requests beyond its rate are refused with rate_limited, and
// beyond its in-flight share with busy, at once and without touching
// PostgreSQL: the database is gone, and the refusals still come.
func TestOverItsShareAPrincipalIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, ingest.Config{LeaseRate: 0.001, LeaseBurst: 3, LeaseInFlight: 100})
	body := []byte(`{"partition":2,"generation":1}`)
	var codes []string
	for range 6 {
		resp, err := e.nc.Request(e.subj.Lease(wire.LeaseRenew, "billing.x"), body, 5*time.Second)
		require.NoError(t, err)
		var er wire.ErrorReply
		require.NoError(t, json.Unmarshal(resp.Data, &er), string(resp.Data))
		codes = append(codes, er.Error)
	}
	require.Equal(t, []string{"lost", "lost", "lost", "rate_limited", "rate_limited", "rate_limited"}, codes,
		"a burst of 3, then refused")
	resp, err := e.nc.Request(e.subj.Lease(wire.LeaseRenew, "reports.a"), body, 5*time.Second)
	require.NoError(t, err)
	require.Contains(t, string(resp.Data), `"error":"lost"`, "another principal has its own share")

	// busy: the requests in flight are capped, whatever the rate. The
	// lease row is locked, so the one admitted renewal waits in the
	// database; the others are answered meanwhile.
	e2, reg := newMeteredEnv(t, ingest.Config{LeaseInFlight: 1, LeaseWorkers: 1})
	l := e2.acquire(2, "billing.x", 60000)
	tx, err := e2.db.Pool.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck
	_, err = tx.Exec(context.Background(), `SELECT 1 FROM ledger.leases WHERE partition = 2 FOR UPDATE`)
	require.NoError(t, err)
	fc := e2.ns.Conn(t)
	replies, err := fc.SubscribeSync("_INBOX.billing.>")
	require.NoError(t, err)
	renew := fmt.Appendf(nil, `{"partition":2,"generation":%d}`, l.Generation)
	for i := range 5 {
		require.NoError(t, fc.PublishRequest(e2.subj.Lease(wire.LeaseRenew, "billing.x"), fmt.Sprintf("_INBOX.billing.%d", i), renew))
	}
	for range 4 {
		m, err := replies.NextMsg(5 * time.Second)
		require.NoError(t, err)
		require.Contains(t, string(m.Data), `"error":"busy"`)
		require.Equal(t, "429", m.Header.Get("Nats-Service-Error-Code"))
	}
	require.NoError(t, tx.Rollback(context.Background()))
	m, err := replies.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Contains(t, string(m.Data), `"generation"`, "the admitted renewal is served once the row is free")
	require.Equal(t, 4.0, refusals(t, reg)["renew/billing"])
}

// A request that waited longer than its age allows is dropped unanswered
// and counted: its requester gave up, and serving it would delay the
// requests still wanted.
func TestAStaleLeaseRequestIsDropped(t *testing.T) {
	t.Parallel()
	e, reg := newMeteredEnv(t, ingest.Config{LeaseWorkers: 1, LeaseMaxAge: 300 * time.Millisecond})
	l := e.acquire(2, "billing.x", 60000)
	tx, err := e.db.Pool.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck
	_, err = tx.Exec(context.Background(), `SELECT 1 FROM ledger.leases WHERE partition = 2 FOR UPDATE`)
	require.NoError(t, err)

	replies, err := e.nc.SubscribeSync("_INBOX.test.>")
	require.NoError(t, err)
	renew := fmt.Appendf(nil, `{"partition":2,"generation":%d}`, l.Generation)
	require.NoError(t, e.nc.PublishRequest(e.subj.Lease(wire.LeaseRenew, "billing.x"), "_INBOX.test.first", renew))
	require.NoError(t, e.nc.Flush())
	require.Eventually(t, func() bool { // the first one waits in the database, holding the only worker
		var n int
		_ = e.db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n)
		return n > 0
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, e.nc.PublishRequest(e.subj.Lease(wire.LeaseRenew, "reports.a"), "_INBOX.test.late", []byte(`{"partition":3,"generation":1}`)))
	require.NoError(t, e.nc.Flush())
	time.Sleep(600 * time.Millisecond) // twice its age: the late one's requester has given up
	require.NoError(t, tx.Rollback(context.Background()))

	m, err := replies.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "_INBOX.test.first", m.Subject)
	_, err = replies.NextMsg(time.Second)
	require.ErrorIs(t, err, nats.ErrTimeout, "the late request was dropped unanswered")
	require.Eventually(t, func() bool { return refusalsOf(t, reg, "renew", "reports", "stale") == 1 }, 5*time.Second, 10*time.Millisecond)
}

// refusalsOf is one series of ledger_refusals_total.
func refusalsOf(t *testing.T, reg *prometheus.Registry, path, principal, reason string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "ledger_refusals_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["path"] == path && labels["principal"] == principal && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
