package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// withInboxes gives each principal an inbox stream of its own, of share
// bytes, before any ingest starts; none keeps the one LEDGER_IN.
func (e *env) withInboxes(share int64, principals ...string) {
	e.t.Helper()
	if len(principals) == 0 {
		return
	}
	require.NoError(e.t, streams.Apply(context.Background(), e.js, streams.Options{
		Partitions: e.store.Partitions(), Principals: principals, InboxMaxBytes: share}))
}

// One principal's full inbox refuses that principal's next event, and only
// its: another principal still publishes, and its event commits, while the
// first one's backlog waits for the ingest. With one LEDGER_IN of the same
// size for both (the subtest "one inbox"), the other principal is refused
// too.
// Switch: the shared LEDGER_IN (the "one inbox" subtest shows the refusal).
func TestOnePrincipalsFullInboxLeavesAnotherCommitting(t *testing.T) {
	t.Parallel()
	for _, perPrincipal := range []bool{true, false} {
		name := map[bool]string{true: "inbox per principal", false: "one inbox"}[perPrincipal]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newBareEnv(t)
			const share = 128 << 10
			// reports' lease, granted by an ingest that then stops: nothing
			// decides the inboxes until they are filled.
			first, err := ingest.New(ingest.Config{}, ingest.Deps{NC: e.ns.Conn(t), Store: e.store})
			require.NoError(t, err)
			require.NoError(t, first.Start(context.Background()))
			l := e.acquire(1, "reports.a", 60000)
			first.Stop()
			for _, n := range []string{wire.StreamIn, wire.InboxStream("billing"), wire.InboxStream("reports")} {
				_ = e.js.DeleteStream(context.Background(), n) // each subtest makes its own
			}
			if perPrincipal {
				e.withInboxes(share, "billing", "reports")
			} else {
				cfg, err := streams.Stream(wire.StreamIn, streams.Options{Partitions: e.store.Partitions()})
				require.NoError(t, err)
				cfg.Subjects = []string{e.subj.InAll()}
				cfg.MaxBytes = share
				_, err = e.js.CreateStream(context.Background(), cfg)
				require.NoError(t, err)
			}
			// billing's backlog, before any ingest decides it: well-formed
			// events on its own tasks, until its inbox refuses one.
			body := fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 1000))
			var refused error
			for i := 0; refused == nil; i++ {
				require.Less(t, i, 1000, "billing's inbox never filled")
				_, refused = e.js.PublishMsg(context.Background(), e.msg(event{id: newID(), partition: 2,
					task: fmt.Sprintf("bill-%d", i), holder: "billing.x", generation: 1, version: 1, typ: "x", payload: body}))
			}
			require.ErrorContains(t, refused, "maximum bytes exceeded")

			quiet := event{id: newID(), partition: 1, task: "report-1", holder: "reports.a", generation: l.Generation,
				version: 1, typ: "x", payload: body}
			ack, err := e.js.PublishMsg(context.Background(), e.msg(quiet))
			if !perPrincipal {
				require.ErrorContains(t, err, "maximum bytes exceeded", "one inbox refuses every principal")
				return
			}
			require.NoError(t, err, "another principal's inbox stores its event")
			require.Equal(t, "LEDGER_IN_reports", ack.Stream)
			rc := e.receipts("reports.a")
			svc, err := ingest.New(ingest.Config{}, ingest.Deps{NC: e.ns.Conn(t), Store: e.store})
			require.NoError(t, err)
			require.NoError(t, svc.Start(context.Background()))
			t.Cleanup(svc.Stop)
			require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, quiet.id).Verdict)
			require.Eventually(t, func() bool { return e.streamPending("LEDGER_IN_billing") == 0 },
				60*time.Second, 50*time.Millisecond, "billing's backlog is decided too")
		})
	}
}

// One principal publishing far faster than the ingest decides builds its
// backlog in its own inbox only. The ingest consumes a partition from every
// inbox, each in lanes of its own, so another principal's events on the
// same partition never wait behind the backlog: its commits (publish to
// receipt) keep their p99 within twice that of a quiet run in the same
// test. The flood is raw publishes of well-formed events on the flooder's
// own tasks, on the partition the other principal holds (so each is judged
// stale there: a partition's valid events are all its lease holder's).
// Switch: one shared LEDGER_IN (inboxes = nil below): the quiet
// principal's events queue behind the whole backlog, and its p99 grows
// with it.
func TestFloodOfOnePrincipalsInboxLeavesAnothersCommits(t *testing.T) {
	inboxes := []string{"reports", "billing"}
	e := newBareEnv(t)
	// A share of 4 MiB: several seconds of the flood's backlog.
	e.withInboxes(4<<20, inboxes...)
	// Two lanes, whatever the CPUs. Each append waits 20 ms first and
	// holds at most 4 events, as a busy database would: the flood outruns
	// the ingest without taking the machine's CPUs from the quiet
	// principal (under the race detector a CPU-bound ingest measures them,
	// not the queues). The appends stay short: the flood's, each under
	// the partition's lease row lock, barely delay the quiet principal's.
	e.svc = e.startIngest(ingest.WithTestHooks(ingest.Config{Lanes: 2, BatchSize: 4}, ingest.TestHooks{
		BeforeAppend: func(ctx context.Context) {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}}))
	const quiet, flooder = "reports.a", "billing.x"
	lease := e.acquire(1, quiet, 60000)
	renewing := make(chan struct{})
	defer close(renewing)
	go func() { // the test outlasts the lease
		for {
			select {
			case <-renewing:
				return
			case <-time.After(10 * time.Second):
				_, _ = e.nc.Request(e.subj.Lease(wire.LeaseRenew, quiet),
					fmt.Appendf(nil, `{"partition":1,"generation":%d,"ttl_ms":60000}`, lease.Generation), 5*time.Second)
			}
		}
	}()

	receipts := map[string]chan struct{}{}
	var mu sync.Mutex
	book := e.receipts(quiet)
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
		case <-time.After(60 * time.Second):
			var rej, ev int
			_ = e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger.rejections WHERE event_id = $1`, id).Scan(&rej)
			_ = e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger.event_ids WHERE event_id = $1`, id).Scan(&ev)
			t.Fatalf("no committed receipt for version %d (%s): other receipts %v, rejections %d, events %d, inbox %d",
				version, id, book.byID[id], rej, ev, e.streamPending(e.inboxOf(inboxes, "reports")))
		}
		return time.Since(start)
	}

	// The flood: raw publishes, unacknowledged, more than the ingest
	// decides (it judges each stale, with a row and a dead letter); a full
	// inbox drops the rest. A faster flood measures this machine's CPUs,
	// not the ingest.
	perTick := 10 // every 10 ms: 1,000 a second
	if raceEnabled {
		perTick = 5
	}
	fc := e.ns.Conn(t)
	var flooding atomic.Bool
	var sent atomic.Int64
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
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
				m := e.msg(event{id: newID(), partition: 1, task: fmt.Sprintf("bill-%d", n*perTick+i),
					holder: flooder, generation: 1, version: 1, typ: "x", payload: `{"n":1}`})
				if fc.PublishMsg(m) == nil {
					sent.Add(1)
				}
			}
		}
	}()
	floodInbox := e.inboxOf(inboxes, "billing")
	const backlog = 500

	window := func(into *[]time.Duration, until time.Time) {
		for range 30 {
			if time.Now().After(until) {
				return
			}
			*into = append(*into, commit())
		}
	}
	// One round: four quiet windows and four flooded ones, alternating, so
	// the machine's own load weighs on both alike. A flooded window starts
	// once the flood's backlog is built, and the next quiet one once the
	// ingest has decided it.
	round := func() bool {
		var calm, flood []time.Duration
		var left uint64
		forever := time.Now().Add(time.Hour)
		window(&calm, forever) // warm up, not counted
		calm = calm[:0]
		for range 4 {
			window(&calm, forever)
			flooding.Store(true)
			require.Eventually(t, func() bool { return e.streamPending(floodInbox) >= backlog }, 60*time.Second,
				10*time.Millisecond, "the flood never outran the ingest")
			// With one shared inbox every commit waits out the backlog: a
			// flooded window ends after 15 s whatever it holds.
			n := len(flood)
			window(&flood, time.Now().Add(15*time.Second))
			left = max(left, e.streamPending(floodInbox))
			t.Logf("flooded window: %d commits, slowest %v, the flood's backlog %d", len(flood)-n,
				slices.Max(flood[n:]), e.streamPending(floodInbox))
			flooding.Store(false)
			require.Eventually(t, func() bool { return e.streamPending(floodInbox) == 0 }, 5*time.Minute,
				50*time.Millisecond, "the flood's backlog is decided")
		}
		c, f := p99(calm), p99(flood)
		t.Logf("commit p99: %v quiet, %v while another principal floods (%.2fx; %d and %d samples; "+
			"%d flood events sent; its backlog %d to %d)", c, f, float64(f)/float64(c), len(calm), len(flood),
			sent.Load(), backlog, left)
		return f <= 2*c
	}
	held := false
	for r := 0; r < 3 && !held; r++ {
		held = round()
	}
	stop()
	<-done
	require.True(t, held, "commit p99 within twice the quiet run's while another principal floods its inbox")
}

// inboxOf is the stream that holds principal's events in this test.
func (e *env) inboxOf(inboxes []string, principal string) string {
	if len(inboxes) == 0 {
		return wire.StreamIn
	}
	return wire.InboxStream(principal)
}

// A principal given an inbox while the ingest runs has its events decided
// without a restart: every beat looks at the inboxes again.
// Switch: syncInboxes left out of the beat (the event waits for ever).
func TestAnInboxAddedWhileRunningIsConsumed(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	e.withInboxes(1<<20, "reports")
	e.svc = e.startIngest(ingest.Config{})
	require.NoError(t, streams.ApplyInboxes(context.Background(), e.js,
		streams.Options{Partitions: e.store.Partitions(), InboxMaxBytes: 1 << 20}, []string{"billing"}))
	rc := e.receipts("billing.x")
	l := e.acquire(2, "billing.x", 60000)
	ev := event{id: newID(), partition: 2, task: "bill-1", holder: "billing.x", generation: l.Generation,
		version: 1, typ: "x"}
	ack, err := e.js.PublishMsg(context.Background(), e.msg(ev))
	require.NoError(t, err)
	require.Equal(t, "LEDGER_IN_billing", ack.Stream)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, ev.id).Verdict)
}

// An inbox the ingest may not read (its credential was written without
// that principal, say) does not keep it from the others: the ingest
// starts, consumes the inboxes it can read, and commits their events; the
// one it cannot is tried again later. The ingest's user here may not ask
// anything of LEDGER_IN_aaa, which sorts first.
// Switch: listInboxes returning at its first failure (the ingest does not
// start: "ingest: inbox streams: stream LEDGER_IN_aaa: ...").
func TestAnInboxTheIngestCannotReadLeavesTheOthersConsumed(t *testing.T) {
	t.Parallel()
	denied := []string{"$JS.API.STREAM.INFO.LEDGER_IN_aaa", "$JS.API.STREAM.CREATE.LEDGER_IN_aaa",
		"$JS.API.STREAM.UPDATE.LEDGER_IN_aaa", "$JS.API.CONSUMER.*.LEDGER_IN_aaa.>"}
	e := &env{t: t, db: dbtest.New(t), ns: natstest.Start(t, natstest.WithOptions(func(o *server.Options) {
		o.NoAuthUser = "admin"
		o.Users = []*server.User{{Username: "admin", Password: "admin"},
			{Username: "ingest", Password: "ingest", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: denied}}}}
	}))}
	var err error
	e.store, err = fence.New(e.db.Pool, fence.Config{})
	require.NoError(t, err)
	e.nc, e.js = e.ns.Conn(t), e.ns.JetStream(t)
	e.withInboxes(1<<20, "aaa", "bbb")

	svc, err := ingest.New(ingest.Config{}, ingest.Deps{NC: e.ns.Conn(t, nats.UserInfo("ingest", "ingest")),
		Store: e.store, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, svc.Start(ctx))
	t.Cleanup(svc.Stop)
	e.svc = svc

	rc := e.receipts("bbb.x")
	l := e.acquire(2, "bbb.x", 60000)
	ev := event{id: newID(), partition: 2, task: "b-1", holder: "bbb.x", generation: l.Generation, version: 1, typ: "x"}
	ack, err := e.js.PublishMsg(context.Background(), e.msg(ev))
	require.NoError(t, err)
	require.Equal(t, "LEDGER_IN_bbb", ack.Stream)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, ev.id).Verdict)
}
