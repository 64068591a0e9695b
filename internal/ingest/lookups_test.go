package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
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
	"github.com/flowness/ledger/pkg/worker"
)

// Against an ingest older than the batch form of verdict lookups, the
// worker's first batch is refused as invalid (unknown field "lookups"),
// and from then on it asks for each event alone, without trying a batch
// again: every event whose receipt was lost still learns that it is
// committed.
// Switch: unknownBatch in pkg/worker/lookups.go returning false (a batch
// is tried every round, refused, and its lookups asked alone).
func TestWorkerFallsBackToSingleLookupsOnAnIngestWithoutBatches(t *testing.T) {
	t.Parallel()
	// The worker's user may not hear receipts: only lookups settle events.
	ns := natstest.Start(t, natstest.WithUserPassword("admin", "admin-pw"), natstest.WithOptions(func(o *server.Options) {
		o.Username, o.Password = "", ""
		o.Users = []*server.User{
			{Username: "admin", Password: "admin-pw"},
			{Username: "deaf", Password: "deaf-pw", Permissions: &server.Permissions{
				Subscribe: &server.SubjectPermission{Deny: []string{wire.Subjects{}.Receipt("*.*")}}}},
		}
	}))
	db := dbtest.New(t)
	store, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	svc, err := ingest.New(ingest.WithTestHooks(ingest.Config{}, ingest.TestHooks{NoLookupBatches: true}),
		ingest.Deps{NC: ns.Conn(t), Store: store, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)

	var mu sync.Mutex
	batches, singles := 0, 0
	spy := ns.Conn(t)
	_, err = spy.Subscribe(wire.Subjects{}.TaskHead(), func(m *nats.Msg) {
		var req wire.TaskHeadRequest
		if json.Unmarshal(m.Data, &req) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case len(req.Lookups) > 0:
			batches++
		case req.EventID != "":
			singles++
		}
	})
	require.NoError(t, err)
	require.NoError(t, spy.Flush())

	nc, err := nats.Connect(ns.URL(), nats.UserInfo("deaf", "deaf-pw"), worker.InboxOption("deaf.1"),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // the refused receipt subscription
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	c, err := worker.New(nc, worker.Config{Holder: "deaf.1", ReceiptTimeout: 200 * time.Millisecond,
		Logger: ledgertest.Logger()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	const n = 200
	ps := make([]*worker.Pending, n)
	for i := range ps {
		ps[i], err = lease.Publish(ctx, fmt.Sprintf("old-%d", i%10), "step", fmt.Appendf(nil, `{"i":%d}`, i))
		require.NoError(t, err)
	}
	for _, p := range ps {
		r, err := p.Receipt(ctx)
		require.NoError(t, err)
		require.Equal(t, wire.VerdictCommitted, r.Verdict, "%+v", r)
	}
	// The spy counts on its own connection: the last requests may reach it
	// after their answers reached the worker.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return singles >= n
	}, 10*time.Second, 10*time.Millisecond, "events settled without a single lookup")
	require.NoError(t, spy.Flush())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, batches, "the worker tried a batch again after the ingest said it does not know the form")
}
