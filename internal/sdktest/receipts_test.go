package sdktest

import (
	"context"
	"encoding/json"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
	"github.com/flowness/ledger/streams"
)

// receiptTimeout is the tests' Config.ReceiptTimeout: short, so a lost
// receipt is looked up well within the tests' bounded waits.
const receiptTimeout = 200 * time.Millisecond

// settleWait bounds every wait that only a verdict lookup can end. Without
// lookups these waits would last forever; with them, about receiptTimeout.
const settleWait = 10 * time.Second

// cutOffWorker is a worker client whose NATS connection runs through a
// proxy the test can cut.
type cutOffWorker struct {
	l     *ledger
	proxy *faultproxy.Proxy
	nc    *nats.Conn
	c     *worker.Client
}

func (l *ledger) cutOffWorker(cfg worker.Config) *cutOffWorker {
	l.t.Helper()
	w := &cutOffWorker{l: l}
	w.proxy, w.nc = l.proxiedConn(cfg.Holder)
	cfg.ReceiptTimeout = receiptTimeout
	w.c = newClient(l.t, w.nc, cfg)
	return w
}

// proxiedConn is a connection for holder's worker that runs through a
// proxy the test can cut; it reconnects soon after the proxy is restored.
func (l *ledger) proxiedConn(holder string) (*faultproxy.Proxy, *nats.Conn) {
	l.t.Helper()
	u, err := url.Parse(l.ns.URL())
	require.NoError(l.t, err)
	proxy := faultproxy.Start(l.t, u.Host)
	nc, err := nats.Connect("nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		worker.InboxOption(holder))
	require.NoError(l.t, err)
	l.t.Cleanup(nc.Close)
	return proxy, nc
}

// publishLosingReceipt publishes one event of task under lease and makes
// sure its receipt never reaches the worker. The test holds the partition's
// lease row locked, so the ingest cannot judge the event (its fenced insert
// waits for the lock) while the worker gets its publish ack and is then cut
// off. Once the server has dropped the worker's connection, and with it its
// receipt subscription, the lock is let go; the test sees the receipt go
// out, and only then lets the worker reconnect. It returns the event and
// the receipt the worker missed.
func (w *cutOffWorker) publishLosingReceipt(ctx context.Context, lease *worker.Lease, task string) (*worker.Pending, wire.Receipt) {
	t := w.l.t
	t.Helper()
	spy := make(chan wire.Receipt, 16)
	spyConn := w.l.ns.Conn(t)
	sub, err := spyConn.Subscribe(wire.Subjects{}.Receipt(w.c.Holder()), func(m *nats.Msg) {
		rs, err := wire.ReceiptsOf(m.Header, m.Data)
		if err != nil {
			return
		}
		for _, r := range rs {
			spy <- r
		}
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, spyConn.Flush())

	tx := w.l.lockLease(ctx, lease.Partition())

	p, err := lease.Publish(ctx, task, "step", []byte(`{"n":1}`))
	require.NoError(t, err)
	_, err = p.PubAck(ctx)
	require.NoError(t, err)

	clients := w.l.ns.Server().NumClients()
	w.proxy.Cut()
	require.Eventually(t, func() bool { return w.l.ns.Server().NumClients() < clients }, 10*time.Second, 5*time.Millisecond,
		"the server still has the worker's connection")
	require.NoError(t, tx.Commit(ctx))

	var missed wire.Receipt
	timeout := time.After(10 * time.Second)
	for missed.EventID != p.ID() { // the holder's earlier events may be receipted still
		select {
		case missed = <-spy:
		case <-timeout:
			t.Fatal("the ingest sent no receipt")
		}
	}
	w.proxy.Restore()
	require.Eventually(t, w.nc.IsConnected, 10*time.Second, 5*time.Millisecond, "the worker did not reconnect")
	select {
	case <-p.Done():
		t.Fatal("the worker got the receipt it was cut off from")
	default:
	}
	return p, missed
}

// seqOf is the seq of event id in ledger.events.
func (l *ledger) seqOf(id string) int64 {
	l.t.Helper()
	var seq int64
	require.NoError(l.t, l.db.Pool.QueryRow(context.Background(),
		`SELECT seq FROM ledger.events WHERE event_id = $1`, id).Scan(&seq))
	return seq
}

// The worker is cut off, so it reconnects: it learns the verdict from the
// answer to the copy it publishes again then (duplicate of its own id,
// settled as committed), or from its lookup, whichever comes first. The
// partition's fields (current_generation, fence_mode) differ between them.
func TestLostReceiptIsLearnedFromTheLedger(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	w := l.cutOffWorker(worker.Config{Holder: "worker-a.1", TTL: 30 * time.Second})
	lease, err := w.c.Acquire(ctx, 2)
	require.NoError(t, err)

	p, missed := w.publishLosingReceipt(ctx, lease, "job")
	require.Equal(t, wire.VerdictCommitted, missed.Verdict)

	wait := testCtx(t, settleWait)
	require.NoError(t, p.Wait(wait), "the lost receipt's verdict was not learned")
	r, err := p.Receipt(wait)
	require.NoError(t, err)
	r.CurrentGeneration, r.FenceMode = 0, ""
	require.Equal(t, wire.Receipt{EventID: p.ID(), Task: "job", Partition: 2, Version: 1,
		Verdict: wire.VerdictCommitted, Seq: l.seqOf(p.ID()), Generation: lease.Generation()}, r)
	require.Equal(t, missed.Seq, r.Seq)
}

func TestLostReceiptFreesItsInFlightSlot(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	w := l.cutOffWorker(worker.Config{Holder: "worker-a.1", TTL: 30 * time.Second, MaxInFlight: 1})
	lease, err := w.c.Acquire(ctx, 2)
	require.NoError(t, err)

	w.publishLosingReceipt(ctx, lease, "job")

	next, err := lease.Publish(testCtx(t, settleWait), "job", "step", []byte(`{"n":2}`))
	require.NoError(t, err, "the only in-flight slot stayed taken by the event whose receipt was lost")
	require.Equal(t, int64(2), next.Version())
	require.NoError(t, next.Wait(ctx))
}

func TestReleaseReturnsAfterALostReceipt(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	w := l.cutOffWorker(worker.Config{Holder: "worker-a.1", TTL: 30 * time.Second})
	lease, err := w.c.Acquire(ctx, 2)
	require.NoError(t, err)

	p, _ := w.publishLosingReceipt(ctx, lease, "job")

	require.NoError(t, lease.Release(testCtx(t, settleWait)), "release waited for a receipt that was lost")
	require.NoError(t, p.Wait(ctx))
	require.False(t, *leaseGet(t, l.ns.Conn(t), 2).Valid, "the lease was not released")
}

// A refused event whose receipt was lost: ResyncTask waits for it, learns
// the refusal from the ledger, and returns the head.
func TestResyncTaskReturnsAfterALostReceipt(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	w := l.cutOffWorker(worker.Config{Holder: "worker-a.1", TTL: 30 * time.Second})
	lease, err := w.c.Acquire(ctx, 1)
	require.NoError(t, err)
	first, err := lease.Publish(ctx, "job", "start", nil)
	require.NoError(t, err)
	require.NoError(t, first.Wait(ctx))

	// Another writer under the same lease (outside this client) takes
	// version 2, so the client's version 2 is a conflict.
	l.writeBehind(ctx, lease, "worker-a.1", "job", 2)

	p, missed := w.publishLosingReceipt(ctx, lease, "job")
	require.Equal(t, wire.VerdictConflict, missed.Verdict)

	head, err := lease.ResyncTask(testCtx(t, settleWait), "job")
	require.NoError(t, err, "resync waited for a receipt that was lost")
	require.Equal(t, int64(2), head)
	var rej *worker.RejectedError
	require.ErrorAs(t, p.Wait(ctx), &rej)
	require.Equal(t, wire.VerdictConflict, rej.Receipt.Verdict)
	require.Equal(t, wire.ReasonVersionTaken, rej.Receipt.Reason)

	next, err := lease.Publish(ctx, "job", "step", nil)
	require.NoError(t, err)
	require.Equal(t, int64(3), next.Version())
	require.NoError(t, next.Wait(ctx))
}

// The receipt a lookup stood in for turns up after all (a redelivered
// event gets a second one): it is dropped, and the event keeps the verdict
// it has.
func TestReceiptArrivingAfterTheLookupIsIgnored(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	w := l.cutOffWorker(worker.Config{Holder: "worker-a.1", TTL: 30 * time.Second, MaxInFlight: 1})
	lease, err := w.c.Acquire(ctx, 2)
	require.NoError(t, err)
	p, missed := w.publishLosingReceipt(ctx, lease, "job")
	require.NoError(t, p.Wait(testCtx(t, settleWait)))
	want, err := p.Receipt(ctx)
	require.NoError(t, err)

	// The missed receipt, and a forged one that disagrees.
	late := missed
	late.Verdict, late.Reason = wire.VerdictStale, wire.ReasonSuperseded
	svc := l.ns.Conn(t)
	for _, r := range []wire.Receipt{missed, late} {
		b, _ := json.Marshal(r)
		require.NoError(t, svc.Publish(wire.Subjects{}.Receipt("worker-a.1"), b))
	}
	require.NoError(t, svc.Flush())
	// A receipt of an event published after them is routed behind them.
	next, err := lease.Publish(ctx, "job", "step", nil)
	require.NoError(t, err)
	require.NoError(t, next.Wait(ctx))

	got, err := p.Receipt(ctx)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.NoError(t, lease.Context().Err(), "a late stale receipt ended the lease")
	require.NoError(t, lease.Release(testCtx(t, settleWait)), "late receipts broke the in-flight count")
}

// While the ledger has no verdict for an event, the client keeps asking,
// every ReceiptTimeout, and never has two lookups of one event in flight
// however slowly the ledger answers.
func TestVerdictLookupsRepeatOneAtATimeWhileTheLedgerHasNone(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	ctx := testCtx(t, 30*time.Second)
	require.NoError(t, streams.Apply(ctx, ns.JetStream(t), streams.Options{}))
	svc := ns.Conn(t)
	fakeLeaseService(t, svc) // grants; nothing judges the events
	// A slow ledger that has no verdict: it answers lookups after
	// answerAfter, with "event": null.
	const answerAfter = 300 * time.Millisecond
	var mu sync.Mutex
	inFlight, most, asked := 0, 0, 0
	lookups, err := svc.QueueSubscribe(wire.Subjects{}.TaskHead(), "slow", func(m *nats.Msg) {
		var req wire.TaskHeadRequest
		require.NoError(t, json.Unmarshal(m.Data, &req))
		if req.EventID == "" && len(req.Lookups) == 0 {
			return // the fake lease service answers head requests
		}
		n := max(1, len(req.Lookups))
		mu.Lock()
		inFlight += n
		asked += n
		most = max(most, inFlight)
		mu.Unlock()
		go func() {
			time.Sleep(answerAfter)
			mu.Lock()
			inFlight -= n
			mu.Unlock()
			var b []byte
			if len(req.Lookups) == 0 {
				b, _ = json.Marshal(wire.TaskHeadEventReply{TaskHeadReply: wire.TaskHeadReply{Task: req.Task}})
			} else {
				var r wire.TaskHeadEventsReply
				for _, l := range req.Lookups {
					r.Heads = append(r.Heads, wire.TaskHeadEventReply{TaskHeadReply: wire.TaskHeadReply{Task: l.Task}})
				}
				b, _ = json.Marshal(r)
			}
			_ = m.Respond(b)
		}()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = lookups.Unsubscribe() })
	require.NoError(t, svc.Flush())

	c := newClient(t, ns.Conn(t, worker.InboxOption("worker-a.1")), worker.Config{Holder: "worker-a.1", ReceiptTimeout: 20 * time.Millisecond})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	p, err := lease.Publish(ctx, "job", "step", nil)
	require.NoError(t, err)
	_, err = p.PubAck(ctx)
	require.NoError(t, err)

	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return asked >= 4 }, 20*time.Second, 10*time.Millisecond,
		"the client stopped asking while the ledger had no verdict")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, most, "lookups of one event overlapped")
	select {
	case <-p.Done():
		t.Fatal("an event was settled without a verdict")
	default:
	}
}
