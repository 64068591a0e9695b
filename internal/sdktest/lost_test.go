package sdktest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// lostSecondEvent commits one event of a lease of ttl, stops the ingest
// (and with it the lease service), publishes a second event and removes
// its LEDGER_IN message, as a stream that lost an acknowledged write.
// startIngest brings an ingest back.
func lostSecondEvent(t *testing.T, holder string, ttl time.Duration) (l *ledger, startIngest func() *ingest.Service,
	lease *worker.Lease, lost *worker.Pending) {
	t.Helper()
	l, startIngest = newStoppableLedger(t)
	first := startIngest()
	ctx := testCtx(t, 60*time.Second)
	c := l.client(nil, worker.Config{Holder: holder, TTL: ttl, ReceiptTimeout: receiptTimeout})
	lease, err := c.Acquire(ctx, 2)
	require.NoError(t, err)
	p1, err := lease.Publish(ctx, "report", "running", []byte(`{"step":1}`))
	require.NoError(t, err)
	require.NoError(t, p1.Wait(ctx))

	first.Stop()
	lost, err = lease.Publish(ctx, "report", "completed", []byte(`{"step":2}`))
	require.NoError(t, err)
	ack, err := lost.PubAck(ctx)
	require.NoError(t, err)
	l.loseInMsg(ctx, ack.Sequence)
	return l, startIngest, lease, lost
}

// An event whose LEDGER_IN message is lost before the ingest saw it (the
// stream lost an acknowledged write) is still committed: the client finds
// that the ledger has no record of it after its receipt timeout, and
// publishes it again, same id and content.
func TestEventLostFromLedgerInIsPublishedAgainAndCommitted(t *testing.T) {
	t.Parallel()
	// A long lease outlasts the ingest's absence.
	l, startIngest, _, p2 := lostSecondEvent(t, "lost.a", 60*time.Second)
	startIngest()
	require.NoError(t, p2.Wait(testCtx(t, settleWait)), "the lost event was not committed")
	rows := l.events("report")
	require.Len(t, rows, 2)
	require.Equal(t, p2.ID(), rows[1].EventID, "committed under its own id")
	require.Equal(t, "completed", rows[1].Type)
}

// An event lost from LEDGER_IN that the client finds unknown only after
// its lease ended still gets its verdict: the client publishes it again
// all the same, and the ledger judges the copy by the event's generation,
// stale, as it would have judged the lost message decided that late.
func TestEventLostAfterItsLeaseEndedIsJudgedStale(t *testing.T) {
	t.Parallel()
	// Without its lease service the lease cannot be renewed and ends by
	// its deadline.
	l, startIngest, lease, p2 := lostSecondEvent(t, "lost.b", 2*time.Second)
	ctx := testCtx(t, 60*time.Second)
	select {
	case <-lease.Lost():
	case <-ctx.Done():
		t.Fatal("the lease was not lost without its lease service")
	}
	// The client gives a lease up before the database's clock ends it: the
	// event is published again only once the ledger's lease has ended
	// too, or it would be committed under it (as it should be).
	require.Eventually(t, func() bool {
		return l.count(`select count(*) from ledger.leases where partition = 2 and expires_at <= clock_timestamp()`) == 1
	}, 10*time.Second, 10*time.Millisecond, "the lease did not end in the database")

	startIngest()
	r, err := p2.Receipt(testCtx(t, settleWait))
	require.NoError(t, err, "the event lost after its lease ended got no verdict")
	require.Equal(t, wire.VerdictStale, r.Verdict)
	require.Equal(t, 1, l.count(`select count(*) from ledger.rejections where event_id = $1 and verdict = 'stale'`, p2.ID()),
		"the stale verdict is recorded")
	require.Len(t, l.events("report"), 1, "only the first event committed")
}

// newStoppableLedger is a ledger whose ingests the test starts (and
// stops) itself: startIngest starts one more.
func newStoppableLedger(t *testing.T) (*ledger, func() *ingest.Service) {
	t.Helper()
	l := &ledger{t: t, db: dbtest.New(t), ns: natstest.Start(t)}
	var err error
	l.store, err = fence.New(l.db.Pool, fence.Config{})
	require.NoError(t, err)
	return l, func() *ingest.Service {
		svc, err := ingest.New(ingest.Config{}, ingest.Deps{NC: l.ns.Conn(t), Store: l.store, Logger: ledgertest.Logger()})
		require.NoError(t, err)
		require.NoError(t, svc.Start(context.Background()))
		t.Cleanup(svc.Stop)
		return svc
	}
}

// loseInMsg deletes LEDGER_IN's message seq, as a server that lost an
// acknowledged write does.
func (l *ledger) loseInMsg(ctx context.Context, seq uint64) {
	l.t.Helper()
	in, err := l.ns.JetStream(l.t).Stream(ctx, wire.StreamIn)
	require.NoError(l.t, err)
	require.NoError(l.t, in.DeleteMsg(ctx, seq), "the acknowledged message is lost")
	_, err = in.GetMsg(ctx, seq)
	require.ErrorIs(l.t, err, jetstream.ErrMsgNotFound)
}

// An event lost from LEDGER_IN with the server's tail is published again
// when the client reconnects, without waiting for a verdict lookup: with
// thousands of events waiting after a loss the lease service refuses most
// lookups as busy. The receipt timeout here is an hour, so only the
// reconnect can send it again. Switch: no resendAcked call in
// watchReconnects (pkg/worker/reconnect.go): no verdict within settleWait.
func TestEventLostFromLedgerInIsPublishedAgainOnReconnect(t *testing.T) {
	t.Parallel()
	l, startIngest := newStoppableLedger(t)
	first := startIngest()
	ctx := testCtx(t, 60*time.Second)
	c := l.client(nil, worker.Config{Holder: "lost.c", TTL: 60 * time.Second, ReceiptTimeout: time.Hour})
	lease, err := c.Acquire(ctx, 2)
	require.NoError(t, err)
	p1, err := lease.Publish(ctx, "report", "running", []byte(`{"step":1}`))
	require.NoError(t, err)
	require.NoError(t, p1.Wait(ctx))

	first.Stop()
	lost, err := lease.Publish(ctx, "report", "completed", []byte(`{"step":2}`))
	require.NoError(t, err)
	ack, err := lost.PubAck(ctx)
	require.NoError(t, err)
	l.loseInMsg(ctx, ack.Sequence)
	l.ns.Shutdown()
	l.ns.Restart(t)

	startIngest()
	require.NoError(t, lost.Wait(testCtx(t, settleWait)), "the lost event was not committed")
	rows := l.events("report")
	require.Len(t, rows, 2)
	require.Equal(t, lost.ID(), rows[1].EventID)
}
