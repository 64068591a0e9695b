package sdktest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
	"github.com/flowness/ledger/streams"
)

func TestEventsCommitAndReleaseWaitsForTheirReceipts(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)
	c := l.client(nil, worker.Config{Holder: "worker-a.1"})

	lease, err := c.Acquire(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, int64(1), lease.Generation())
	require.Equal(t, 3, lease.Partition())

	var pending []*worker.Pending
	for _, task := range []struct {
		id string
		n  int
	}{{"report-7", 3}, {"report-8", 2}} {
		for i := 1; i <= task.n; i++ {
			p, err := lease.Publish(ctx, task.id, "step", fmt.Appendf(nil, `{"i":%d}`, i))
			require.NoError(t, err)
			require.Equal(t, int64(i), p.Version())
			require.True(t, wire.ValidEventID(p.ID()))
			pending = append(pending, p)
		}
	}

	require.NoError(t, lease.Release(ctx))
	for _, p := range pending {
		select {
		case <-p.Done():
		default:
			t.Fatalf("Release returned before the receipt of event %s", p.ID())
		}
		r, err := p.Receipt(ctx)
		require.NoError(t, err)
		require.Equal(t, wire.VerdictCommitted, r.Verdict, "%+v", r)
		require.Equal(t, p.Version(), r.Version)
		require.Equal(t, lease.Generation(), r.Generation)
		require.NoError(t, p.Wait(ctx))
		ack, err := p.PubAck(ctx)
		require.NoError(t, err)
		if ack != nil { // nil only if the receipt overtook a lost ack
			require.Equal(t, wire.StreamIn, ack.Stream)
		}
	}

	rows := l.events("report-7")
	require.Len(t, rows, 3)
	for i, r := range rows {
		require.Equal(t, row{Task: "report-7", Version: int64(i + 1), EventID: pending[i].ID(),
			Holder: "worker-a.1", Generation: 1, Type: "step"}, r)
	}
	require.Len(t, l.events("report-8"), 2)

	got := leaseGet(t, l.ns.Conn(t), 3)
	require.False(t, *got.Valid, "released lease is still valid")
	require.Equal(t, int64(1), got.Generation, "release changed the generation")

	require.ErrorIs(t, context.Cause(lease.Context()), worker.ErrReleased)
	select {
	case <-lease.Lost():
		t.Fatal("a released lease reports a loss")
	default:
	}
	_, err = lease.Publish(ctx, "report-7", "late", nil)
	require.ErrorIs(t, err, worker.ErrReleased)
}

func TestNextLeaseContinuesTaskFromItsHead(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)

	first := l.client(nil, worker.Config{Holder: "worker-a.1"})
	lease, err := first.Acquire(ctx, 5)
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		_, err := lease.Publish(ctx, "report-9", "step", nil)
		require.NoError(t, err)
	}
	require.NoError(t, lease.Release(ctx))

	second := l.client(nil, worker.Config{Holder: "worker-a.2"})
	next, err := second.Acquire(ctx, 5)
	require.NoError(t, err)
	require.Equal(t, int64(2), next.Generation())
	p, err := next.Publish(ctx, "report-9", "done", []byte(`{"ok":true}`))
	require.NoError(t, err)
	require.Equal(t, int64(4), p.Version())
	require.NoError(t, p.Wait(ctx))

	head, err := second.TaskHead(ctx, "report-9")
	require.NoError(t, err)
	require.Equal(t, int64(4), head.Version)
	require.Equal(t, 5, *head.Partition)
	require.NotNil(t, head.Type, "the head does not tell the last event's type")
	require.Equal(t, "done", *head.Type)
	unknown, err := second.TaskHead(ctx, "never-written")
	require.NoError(t, err)
	require.Zero(t, unknown.Version)
	require.Nil(t, unknown.Partition)
	require.Nil(t, unknown.Type)
	rows := l.events("report-9")
	require.Len(t, rows, 4)
	require.Equal(t, "worker-a.2", rows[3].Holder)
	require.Equal(t, int64(2), rows[3].Generation)
}

func TestAcquireOfAPartitionHeldByAnotherFailsWithErrHeld(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)
	a := l.client(nil, worker.Config{Holder: "worker-a.1"})
	b := l.client(nil, worker.Config{Holder: "worker-b.1"})

	held, err := a.Acquire(ctx, 4)
	require.NoError(t, err)

	_, err = b.Acquire(ctx, 4)
	require.ErrorIs(t, err, worker.ErrHeld)
	var se *worker.ServiceError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "worker-a.1", se.Holder)
	require.Equal(t, held.Generation(), se.Generation)
	require.False(t, se.ExpiresAt.IsZero())

	_, err = a.Acquire(ctx, 4)
	require.ErrorIs(t, err, worker.ErrLeaseActive, "a second acquire would fence the client's own lease")

	_, err = b.Acquire(ctx, 999)
	require.ErrorIs(t, err, worker.ErrInvalid)
}

func TestNewRefusesInvalidConfig(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	// The connection's replies come to the principal w's inbox, so that
	// each case is refused for its own reason, which the error names.
	nc := ns.Conn(t, worker.InboxOption("w.1"))
	for _, tc := range []struct {
		name, want string
		cfg        worker.Config
	}{
		{"no holder", "must be <principal>.<instance>", worker.Config{}},
		{"holder without an instance", "must be <principal>.<instance>", worker.Config{Holder: "worker"}},
		{"holder with three parts", "must be <principal>.<instance>", worker.Config{Holder: "w.1.x"}},
		{"holder too long", "must be <principal>.<instance>", worker.Config{Holder: string(make([]byte, 129))}},
		{"prefix with a dot", "prefix", worker.Config{Holder: "w.1", Prefix: "a.b"}},
		{"ttl below 100 ms", "ttl", worker.Config{Holder: "w.1", TTL: 50 * time.Millisecond}},
		{"ttl not whole ms", "ttl", worker.Config{Holder: "w.1", TTL: time.Second + time.Microsecond}},
		{"renewal after half the ttl", "renew interval", worker.Config{Holder: "w.1", TTL: time.Second, RenewEvery: 600 * time.Millisecond}},
		{"negative in flight", "max in flight", worker.Config{Holder: "w.1", MaxInFlight: -1}},
		{"replies to another principal's inbox", "replies must come to _INBOX.v.>", worker.Config{Holder: "v.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := worker.New(nc, tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := worker.New(ns.Conn(t), worker.Config{Holder: "w.1"})
	require.ErrorContains(t, err, "replies must come to _INBOX.w.>", "a connection with nats.go's own inbox")
	_, err = worker.New(nil, worker.Config{Holder: "w.1"})
	require.Error(t, err)
}

func TestTaskPinnedToAnotherPartitionIsRefusedBeforePublishing(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)
	c := l.client(nil, worker.Config{Holder: "worker-a.1"})

	on3, err := c.Acquire(ctx, 3)
	require.NoError(t, err)
	p, err := on3.Publish(ctx, "pinned", "start", nil)
	require.NoError(t, err)
	require.NoError(t, p.Wait(ctx))

	on5, err := c.Acquire(ctx, 5)
	require.NoError(t, err)
	// The head comes after Publish returned: the event ends unsent.
	refused, err := on5.Publish(ctx, "pinned", "step", nil)
	require.NoError(t, err)
	_, err = refused.Receipt(ctx)
	require.ErrorIs(t, err, worker.ErrWrongPartition)
	require.Zero(t, refused.Version())
	// Once the head is known the refusal is at once.
	_, err = on5.Publish(ctx, "pinned", "step", nil)
	require.ErrorIs(t, err, worker.ErrWrongPartition)

	// Nothing was sent: no dead letter, no rejection, one committed row;
	// and the lease goes on with other tasks.
	p, err = on5.Publish(ctx, "other", "start", nil)
	require.NoError(t, err)
	require.NoError(t, p.Wait(ctx))
	require.Equal(t, 1, l.count(`SELECT count(*) FROM ledger.events WHERE task_id = 'pinned'`))
	require.Equal(t, 0, l.count(`SELECT count(*) FROM ledger.rejections`))
	dlq, err := l.ns.JetStream(t).Stream(ctx, wire.StreamDLQ)
	require.NoError(t, err)
	info, err := dlq.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs)
}

func TestEventThatComesBackStaleEndsTheLease(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)
	// A long TTL: the next renewal is seconds away, so only the receipt can
	// tell the old incarnation it was fenced.
	old := l.client(nil, worker.Config{Holder: "worker-a.1", TTL: 30 * time.Second})
	restarted := l.client(nil, worker.Config{Holder: "worker-a.1", TTL: 30 * time.Second})

	stale, err := old.Acquire(ctx, 2)
	require.NoError(t, err)
	fresh, err := restarted.Acquire(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, stale.Generation()+1, fresh.Generation())

	p, err := stale.Publish(ctx, "job", "step", nil)
	require.NoError(t, err)
	var rej *worker.RejectedError
	require.ErrorAs(t, p.Wait(ctx), &rej)
	require.Equal(t, wire.VerdictStale, rej.Receipt.Verdict)
	require.Equal(t, wire.ReasonSuperseded, rej.Receipt.Reason)

	select {
	case <-stale.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a stale receipt did not end the lease")
	}
	require.ErrorIs(t, context.Cause(stale.Context()), worker.ErrLeaseLost)
	_, err = stale.Publish(ctx, "job", "step", nil)
	require.ErrorIs(t, err, worker.ErrLeaseLost)
	// Publishing under the lease's own (done) context tells the loss too,
	// not merely a cancelled context.
	for i := 0; i < 20; i++ {
		_, err = stale.Publish(stale.Context(), "job", "step", nil)
		require.ErrorIs(t, err, worker.ErrLeaseLost)
	}
	require.ErrorIs(t, stale.Release(ctx), worker.ErrLeaseLost)

	require.NoError(t, fresh.Context().Err(), "the new incarnation must keep its lease")
}

func TestRenewalRefusedEndsTheLease(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)
	old := l.client(nil, worker.Config{Holder: "worker-a.1", TTL: 600 * time.Millisecond})
	restarted := l.client(nil, worker.Config{Holder: "worker-a.1"})

	stale, err := old.Acquire(ctx, 6)
	require.NoError(t, err)
	_, err = restarted.Acquire(ctx, 6)
	require.NoError(t, err)
	select {
	case <-stale.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a refused renewal did not end the lease")
	}
	cause := context.Cause(stale.Context())
	require.ErrorIs(t, cause, worker.ErrLeaseLost)
	require.ErrorIs(t, cause, worker.ErrLost, "the loss should come from the refused renewal: %v", cause)
}

// A standby that learns of its loss acquires again at once; the client
// must have forgotten the lost lease by then, or the acquire is refused
// with ErrLeaseActive (as a SIGSTOPped example worker once was). Two
// clients of one holder take the partition from each other, each the
// instant its lease is lost, several times over: each race is one chance
// for a notification that comes before the forgetting.
func TestLeaseLostCanBeAcquiredAgainTheMomentItIsLost(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	const partition = 5
	cfg := worker.Config{Holder: "worker-a.1", TTL: 600 * time.Millisecond, RenewEvery: 60 * time.Millisecond}
	clients := []*worker.Client{l.client(nil, cfg), l.client(nil, cfg)}
	// The same holder acquiring again gets the next generation and fences
	// the earlier one, whose renewal is then refused: fenced is lost soon,
	// and its client takes the partition back the moment it is told,
	// fencing current in turn.
	fenced, err := clients[0].Acquire(ctx, partition)
	require.NoError(t, err)
	current, err := clients[1].Acquire(ctx, partition)
	require.NoError(t, err)
	for round := 0; round < 80; round++ {
		select {
		case <-fenced.Lost():
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: the fenced lease was not lost", round)
		}
		back, err := clients[round%2].Acquire(ctx, partition)
		require.NoError(t, err, "round %d: acquire right after the loss", round)
		require.Equal(t, current.Generation()+1, back.Generation())
		fenced, current = current, back
	}
}

func TestRefusedEventStopsItsTaskUntilResync(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)
	c := l.client(nil, worker.Config{Holder: "worker-a.1"})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	p, err := lease.Publish(ctx, "job", "start", nil)
	require.NoError(t, err)
	require.NoError(t, p.Wait(ctx))

	// Another writer under the same lease (outside this client) takes
	// version 2 behind the client's back.
	l.writeBehind(ctx, lease, "worker-a.1", "job", 2)

	p, err = lease.Publish(ctx, "job", "step", []byte(`{"n":2}`))
	require.NoError(t, err)
	var rej *worker.RejectedError
	require.ErrorAs(t, p.Wait(ctx), &rej)
	require.Equal(t, wire.VerdictConflict, rej.Receipt.Verdict)

	_, err = lease.Publish(ctx, "job", "step", []byte(`{"n":3}`))
	require.ErrorIs(t, err, worker.ErrResyncNeeded)

	head, err := lease.ResyncTask(ctx, "job")
	require.NoError(t, err)
	require.Equal(t, int64(2), head)
	p, err = lease.Publish(ctx, "job", "step", []byte(`{"n":3}`))
	require.NoError(t, err)
	require.Equal(t, int64(3), p.Version())
	require.NoError(t, p.Wait(ctx))
}

// fakeLeaseService answers the lease service's subjects with grants that
// never expire, heads of version 0 and the default partition count, so publishing can be tested
// without an ingest: nothing ever judges the events. It does not answer
// verdict lookups.
func fakeLeaseService(t *testing.T, nc *nats.Conn) {
	t.Helper()
	subj := wire.Subjects{}
	for _, op := range []string{wire.LeaseAcquire, wire.LeaseRenew} {
		_, err := nc.Subscribe(subj.LeaseAny(op), func(m *nats.Msg) {
			var req wire.LeaseRequest
			require.NoError(t, json.Unmarshal(m.Data, &req))
			holder, err := subj.ParseLease(op, m.Subject)
			require.NoError(t, err)
			b, _ := json.Marshal(wire.LeaseReply{Partition: *req.Partition, Holder: holder, Generation: 1,
				ExpiresAt: wire.FormatTime(time.Now().Add(time.Hour)), TTLMillis: 3000})
			_ = m.Respond(b)
		})
		require.NoError(t, err)
	}
	_, err := nc.Subscribe(subj.LeaseGet(), func(m *nats.Msg) {
		var req wire.LeaseRequest
		require.NoError(t, json.Unmarshal(m.Data, &req))
		valid := false
		b, _ := json.Marshal(wire.LeaseReply{Partition: *req.Partition, Valid: &valid, Partitions: wire.PartitionsDefault})
		_ = m.Respond(b)
	})
	require.NoError(t, err)
	_, err = nc.Subscribe(subj.TaskHead(), func(m *nats.Msg) {
		var req wire.TaskHeadRequest
		_ = json.Unmarshal(m.Data, &req)
		if req.EventID != "" || len(req.Lookups) > 0 {
			return // verdict lookups are left to the test
		}
		if len(req.Tasks) > 0 {
			var r wire.TaskHeadsReply
			for _, task := range req.Tasks {
				r.Heads = append(r.Heads, wire.TaskHeadReply{Task: task})
			}
			b, _ := json.Marshal(r)
			_ = m.Respond(b)
			return
		}
		b, _ := json.Marshal(wire.TaskHeadReply{Task: req.Task})
		_ = m.Respond(b)
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
}

func TestPublishBlocksWhileMaxInFlightEventsAwaitReceipts(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	ctx := testCtx(t, 20*time.Second)
	require.NoError(t, streams.Apply(ctx, ns.JetStream(t), streams.Options{}))
	svc := ns.Conn(t)
	fakeLeaseService(t, svc)

	c := newClient(t, ns.Conn(t, worker.InboxOption("worker-a.1")), worker.Config{Holder: "worker-a.1", MaxInFlight: 2})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	p1, err := lease.Publish(ctx, "job", "step", nil)
	require.NoError(t, err)
	p2, err := lease.Publish(ctx, "other", "step", nil)
	require.NoError(t, err)
	for _, p := range []*worker.Pending{p1, p2} {
		ack, err := p.PubAck(ctx)
		require.NoError(t, err)
		require.Equal(t, wire.StreamIn, ack.Stream)
	}

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = lease.Publish(short, "job", "step", nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)

	// A receipt frees a slot, and the blocked publish goes through with
	// the next version of its task.
	done := make(chan *worker.Pending, 1)
	go func() {
		p, err := lease.Publish(ctx, "job", "step", nil)
		if err != nil {
			t.Error(err)
		}
		done <- p
	}()
	select {
	case <-done:
		t.Fatal("publish did not wait for a free slot")
	case <-time.After(100 * time.Millisecond):
	}
	b, _ := json.Marshal(wire.Receipt{EventID: p1.ID(), Task: "job", Partition: 1, Version: 1,
		Verdict: wire.VerdictCommitted, Seq: 1, Generation: 1})
	require.NoError(t, svc.Publish(wire.Subjects{}.Receipt("worker-a.1"), b))
	select {
	case p3 := <-done:
		require.Equal(t, int64(2), p3.Version())
	case <-time.After(5 * time.Second):
		t.Fatal("a receipt did not free a slot")
	}
	require.NoError(t, p1.Wait(ctx))
}

func TestConcurrentPublishersOfOneTaskGetDenseVersions(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)
	c := l.client(nil, worker.Config{Holder: "worker-a.1", MaxInFlight: 16})
	lease, err := c.Acquire(ctx, 0)
	require.NoError(t, err)

	const writers, each = 4, 25
	pending := make(chan *worker.Pending, writers*each)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				p, err := lease.Publish(ctx, "shared", "step", fmt.Appendf(nil, `{"w":%d,"i":%d}`, w, i))
				if err != nil {
					t.Error(err)
					return
				}
				pending <- p
			}
		}()
	}
	wg.Wait()
	close(pending)
	require.NoError(t, lease.Release(ctx))

	seen := map[int64]bool{}
	for p := range pending {
		require.NoError(t, p.Wait(ctx))
		require.False(t, seen[p.Version()], "version %d assigned twice", p.Version())
		seen[p.Version()] = true
	}
	rows := l.events("shared")
	require.Len(t, rows, writers*each)
	for i, r := range rows {
		require.Equal(t, int64(i+1), r.Version)
	}
}

// A renewal whose reply never comes is sent again in time: the lease
// survives one lost renewal reply at the default 3 s TTL.
func TestLostRenewalReplyIsRetriedBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	ctx := testCtx(t, 30*time.Second)
	require.NoError(t, streams.Apply(ctx, ns.JetStream(t), streams.Options{}))
	svc := ns.Conn(t)
	subj := wire.Subjects{}
	var renewals atomic.Int64
	reply := func(m *nats.Msg, partition int) {
		b, _ := json.Marshal(wire.LeaseReply{Partition: partition, Holder: "worker-a.1", Generation: 1,
			ExpiresAt: wire.FormatTime(time.Now().Add(3 * time.Second)), TTLMillis: 3000})
		_ = m.Respond(b)
	}
	for _, s := range []string{subj.LeaseAny(wire.LeaseAcquire), subj.LeaseAny(wire.LeaseRenew)} {
		renew := s == subj.LeaseAny(wire.LeaseRenew)
		_, err := svc.Subscribe(s, func(m *nats.Msg) {
			var req wire.LeaseRequest
			require.NoError(t, json.Unmarshal(m.Data, &req))
			if renew && renewals.Add(1) == 1 {
				return // the first renewal's reply is lost
			}
			reply(m, *req.Partition)
		})
		require.NoError(t, err)
	}
	require.NoError(t, svc.Flush())
	c := newClient(t, ns.Conn(t, worker.InboxOption("worker-a.1")), worker.Config{Holder: "worker-a.1", Partitions: 16})
	lease, err := c.Acquire(ctx, 2)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return renewals.Load() >= 3 }, 10*time.Second, 10*time.Millisecond)
	select {
	case <-lease.Lost():
		t.Fatalf("the lease was lost after one lost renewal reply: %v", context.Cause(lease.Context()))
	default:
	}
}

// A connection that stops reconnecting (nats.go's default: 60 attempts)
// closes for good after a long outage, and the events still waiting for
// their verdicts never get them: New says so once, at the warning level.
// A connection that reconnects for ever is not warned about.
// Switch: the check in New (no warning, and the first case fails).
func TestNewWarnsOfAConnectionThatStopsReconnecting(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	cfg := worker.Config{Holder: "w.1", Partitions: 4}
	for _, tc := range []struct {
		name string
		opt  nats.Option
		warn int
	}{
		{"nats.go's default", nats.MaxReconnects(60), 1},
		{"no reconnect", nats.NoReconnect(), 1},
		{"for ever", nats.MaxReconnects(-1), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			cfg.Logger = slog.New(rec)
			newClient(t, ns.Conn(t, worker.InboxOption(cfg.Holder), tc.opt), cfg)
			require.Equal(t, tc.warn, rec.count("the NATS connection stops reconnecting", time.Time{}), rec.String())
		})
	}
}
