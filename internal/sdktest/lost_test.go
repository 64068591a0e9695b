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

// An event whose LEDGER_IN message is lost before the ingest saw it (the
// stream lost an acknowledged write) is still committed: the client finds
// that the ledger has no record of it after its receipt timeout, and
// publishes it again, same id and content, while its lease lasts.
func TestEventLostFromLedgerInIsPublishedAgainAndCommitted(t *testing.T) {
	t.Parallel()
	l := &ledger{t: t, db: dbtest.New(t), ns: natstest.Start(t)}
	var err error
	l.store, err = fence.New(l.db.Pool, fence.Config{})
	require.NoError(t, err)
	startIngest := func() *ingest.Service {
		svc, err := ingest.New(ingest.Config{}, ingest.Deps{NC: l.ns.Conn(t), Store: l.store, Logger: ledgertest.Logger()})
		require.NoError(t, err)
		require.NoError(t, svc.Start(context.Background()))
		t.Cleanup(svc.Stop)
		return svc
	}
	first := startIngest()
	ctx := testCtx(t, 60*time.Second)
	// A long lease outlasts the ingest's absence, which also takes the
	// lease service away.
	c := l.client(nil, worker.Config{Holder: "lost.a", TTL: 60 * time.Second, ReceiptTimeout: receiptTimeout})
	lease, err := c.Acquire(ctx, 2)
	require.NoError(t, err)
	p1, err := lease.Publish(ctx, "report", "running", []byte(`{"step":1}`))
	require.NoError(t, err)
	require.NoError(t, p1.Wait(ctx))

	first.Stop()
	p2, err := lease.Publish(ctx, "report", "completed", []byte(`{"step":2}`))
	require.NoError(t, err)
	ack, err := p2.PubAck(ctx)
	require.NoError(t, err)
	in, err := l.ns.JetStream(t).Stream(ctx, wire.StreamIn)
	require.NoError(t, err)
	require.NoError(t, in.DeleteMsg(ctx, ack.Sequence), "the acknowledged message is lost")
	_, err = in.GetMsg(ctx, ack.Sequence)
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)

	startIngest()
	require.NoError(t, p2.Wait(testCtx(t, settleWait)), "the lost event was not committed")
	rows := l.events("report")
	require.Len(t, rows, 2)
	require.Equal(t, p2.ID(), rows[1].EventID, "committed under its own id")
	require.Equal(t, "completed", rows[1].Type)
}
