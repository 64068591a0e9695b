package sdktest

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

// deafUser is a NATS user that may not subscribe to receipts: every
// receipt of its worker is lost, as after a loss, and only verdict lookups
// settle its events.
const deafUser, deafPassword = "deaf", "deaf-pw"

// newDeafLedger is newLedger on a server where deafUser hears no receipt;
// the test's own connections authenticate as an admin that may do
// anything.
func newDeafLedger(t *testing.T) *ledger {
	t.Helper()
	l := &ledger{t: t, db: dbtest.New(t)}
	l.ns = natstest.Start(t, natstest.WithUserPassword("admin", "admin-pw"), natstest.WithOptions(func(o *server.Options) {
		o.Username, o.Password = "", ""
		o.Users = []*server.User{
			{Username: "admin", Password: "admin-pw"},
			{Username: deafUser, Password: deafPassword, Permissions: &server.Permissions{
				Subscribe: &server.SubjectPermission{Deny: []string{wire.Subjects{}.Receipt("*.*")}}}},
		}
	}))
	var err error
	l.store, err = fence.New(l.db.Pool, fence.Config{})
	require.NoError(t, err)
	svc, err := ingest.New(ingest.Config{}, ingest.Deps{NC: l.ns.Conn(t), Store: l.store, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	return l
}

// deafConn is a connection of deafUser for holder's worker.
func (l *ledger) deafConn(holder string) *nats.Conn {
	l.t.Helper()
	nc, err := nats.Connect(l.ns.URL(), nats.UserInfo(deafUser, deafPassword), worker.InboxOption(holder),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // the refused receipt subscription
	require.NoError(l.t, err)
	l.t.Cleanup(nc.Close)
	return nc
}

// lookupSpy counts the verdict lookups sent to the lease service, the
// requests that carried them, and the replies that refused a request of
// principal as over its share (busy or rate_limited).
type lookupSpy struct {
	mu                         sync.Mutex
	requests, lookups, refused int
}

func (l *ledger) spyLookups(principal string) *lookupSpy {
	l.t.Helper()
	s := &lookupSpy{}
	nc := l.ns.Conn(l.t)
	_, err := nc.Subscribe(wire.Subjects{}.TaskHead(), func(m *nats.Msg) {
		var req wire.TaskHeadRequest
		if json.Unmarshal(m.Data, &req) != nil || (req.EventID == "" && len(req.Lookups) == 0) {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.requests++
		s.lookups += max(1, len(req.Lookups))
	})
	require.NoError(l.t, err)
	_, err = nc.Subscribe("_INBOX."+principal+".>", func(m *nats.Msg) {
		if m.Header.Get("Nats-Service-Error-Code") == "429" {
			s.mu.Lock()
			s.refused++
			s.mu.Unlock()
		}
	})
	require.NoError(l.t, err)
	require.NoError(l.t, nc.Flush())
	return s
}

func (s *lookupSpy) counts() (requests, lookups, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests, s.lookups, s.refused
}

// lookupBatchMax is the client's Config.LookupBatchMax in the lookup
// tests; 1 switches batches off.
const lookupBatchMax = 0

// After a loss thousands of events wait for their verdicts at once. Their
// lookups go together in a few requests, within the principal's share of
// the lease service: every event learns it is committed, and no request is
// refused. One request per event is refused busy by the dozen.
// Switch: lookupBatchMax = 1 (a request per event: refusals, many requests).
func TestThousandsOfLookupsGoInFewRequestsAndNoneIsRefused(t *testing.T) {
	t.Parallel()
	l := newDeafLedger(t)
	ctx := testCtx(t, 3*time.Minute)
	const n = 2000
	spy := l.spyLookups(deafUser)
	c := newClient(t, l.deafConn(deafUser+".1"), worker.Config{Holder: deafUser + ".1", MaxInFlight: n,
		ReceiptTimeout: time.Second, LookupBatchMax: lookupBatchMax})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	tasks := make([]string, 50)
	for i := range tasks {
		tasks[i] = fmt.Sprintf("lost-%d", i)
	}
	for _, p := range publishMany(ctx, t, lease, tasks, n) {
		r, err := p.Receipt(ctx)
		require.NoError(t, err)
		require.Equal(t, wire.VerdictCommitted, r.Verdict, "%+v", r)
		require.Positive(t, r.Seq)
	}
	// The spy counts on its own connection: the last requests may reach it
	// after their answers reached the worker.
	require.Eventually(t, func() bool { _, lookups, _ := spy.counts(); return lookups >= n }, 10*time.Second,
		10*time.Millisecond, "an event settled without a lookup: its receipt came")
	requests, lookups, refused := spy.counts()
	t.Logf("%d events: %d lookups in %d requests, %d refused", n, lookups, requests, refused)
	require.Zero(t, refused, "lookups refused as over the principal's share")
	require.LessOrEqual(t, requests, n/20, "%d lookups took %d requests", lookups, requests)
}
