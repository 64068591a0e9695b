package sdktest

import (
	"context"
	"fmt"
	"math"
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

// The bug: after SIGTERM cancelled a worker's context, Publish still
// sent about half of the time, because a free in-flight slot and the done
// context raced in one select. A cancelled context must never send. No
// ingest runs, so whatever was sent stays in LEDGER_IN to be counted.
func TestPublishWithACancelledContextSendsNothing(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	ctx := testCtx(t, 20*time.Second)
	js := ns.JetStream(t)
	require.NoError(t, streams.Apply(ctx, js, streams.Options{}))
	fakeLeaseService(t, ns.Conn(t))
	c := newClient(t, ns.Conn(t, worker.InboxOption("worker-a.1")), worker.Config{Holder: "worker-a.1"})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)

	// The task's head is known after this one, so nothing but the slot
	// stands between a publish and the wire.
	p, err := lease.Publish(ctx, "job", "step", nil)
	require.NoError(t, err)
	_, err = p.PubAck(ctx)
	require.NoError(t, err)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	sent := 0
	for i := 0; i < 100; i++ {
		p, err := lease.Publish(cancelled, "job", "step", nil)
		if p != nil {
			sent++
			continue
		}
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "not sent")
	}
	for i := 0; i < 100; i++ {
		p, err := lease.PublishJSON(cancelled, "job", "step", map[string]int{"i": i})
		if p != nil {
			sent++
			continue
		}
		require.ErrorIs(t, err, context.Canceled)
	}

	// One more with a live context flushes the connection.
	p, err = lease.Publish(ctx, "job", "step", nil)
	require.NoError(t, err)
	_, err = p.PubAck(ctx)
	require.NoError(t, err)
	in, err := js.Stream(ctx, wire.StreamIn)
	require.NoError(t, err)
	info, err := in.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, sent, "%d of 200 publishes with a cancelled context were sent; LEDGER_IN holds %d events", sent, info.State.Msgs)
	require.Equal(t, uint64(2), info.State.Msgs, "events sent with a cancelled context reached LEDGER_IN")
	// No version was used up by the refused ones.
	require.Equal(t, int64(2), p.Version())
}

func TestPublishJSONCommitsTheEncodedValueAndRefusesWhatCannotBeEncoded(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 20*time.Second)
	c := l.client(nil, worker.Config{Holder: "worker-a.1"})
	lease, err := c.Acquire(ctx, 2)
	require.NoError(t, err)

	type step struct {
		N    int    `json:"n"`
		Note string `json:"note"`
	}
	p, err := lease.PublishJSON(ctx, "job", "running", step{N: 1, Note: "a \"quoted\" note"})
	require.NoError(t, err)
	require.NoError(t, p.Wait(ctx))
	var payload string
	require.NoError(t, l.db.Pool.QueryRow(ctx, `SELECT payload::text FROM ledger.events WHERE event_id = $1`, p.ID()).Scan(&payload))
	require.JSONEq(t, `{"n":1,"note":"a \"quoted\" note"}`, payload)

	for name, v := range map[string]any{"NaN": math.NaN(), "channel": make(chan int), "func": func() {}} {
		_, err := lease.PublishJSON(ctx, "job", "running", v)
		require.ErrorIs(t, err, worker.ErrInvalid, name)
		require.ErrorContains(t, err, "not sent", name)
	}
	// Nothing of the refused values used a version.
	p, err = lease.PublishJSON(ctx, "job", "completed", nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), p.Version())
	require.NoError(t, p.Wait(ctx))
	require.Len(t, l.events("job"), 2)
}

// A worker that starts on many fresh tasks at once asks for their heads in
// a few requests, not one per task: the lookups of concurrent publishers
// share a request.
func TestHeadsOfFreshTasksAreAskedTogether(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	spy := l.ns.Conn(t)
	var requests atomic.Int64
	_, err := spy.Subscribe(wire.Subjects{}.TaskHead(), func(*nats.Msg) { requests.Add(1) })
	require.NoError(t, err)
	require.NoError(t, spy.Flush())

	c := l.client(nil, worker.Config{Holder: "worker-a.1"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := c.Acquire(ctx, 4)
	require.NoError(t, err)
	const tasks = 300
	var wg sync.WaitGroup
	errs := make(chan error, tasks)
	for i := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := lease.Publish(ctx, fmt.Sprintf("fresh-%d", i), "start", []byte(`{}`)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return l.count(`SELECT count(*) FROM ledger.events`) == tasks }, 20*time.Second, 20*time.Millisecond)
	require.Less(t, requests.Load(), int64(tasks/10), "%d head requests for %d fresh tasks", requests.Load(), tasks)
}

// One goroutine publishing the first event of many fresh tasks in turn does
// not wait for each task's head: Publish queues the event and returns, and
// the heads are asked for together.
func TestPublishDoesNotWaitForTheHeadOfAFreshTask(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	spy := l.ns.Conn(t)
	var requests atomic.Int64
	_, err := spy.Subscribe(wire.Subjects{}.TaskHead(), func(*nats.Msg) { requests.Add(1) })
	require.NoError(t, err)
	require.NoError(t, spy.Flush())

	c := l.client(nil, worker.Config{Holder: "worker-a.1"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := c.Acquire(ctx, 6)
	require.NoError(t, err)
	const tasks = 300
	var ps []*worker.Pending
	for i := range tasks {
		for v := range 2 {
			p, err := lease.Publish(ctx, fmt.Sprintf("seq-%d", i), fmt.Sprintf("step-%d", v), []byte(`{}`))
			require.NoError(t, err)
			ps = append(ps, p)
		}
	}
	for i, p := range ps {
		require.NoError(t, p.Wait(ctx))
		require.EqualValues(t, i%2+1, p.Version(), "versions in call order")
	}
	require.Less(t, requests.Load(), int64(tasks/10), "%d head requests for %d fresh tasks", requests.Load(), tasks)
}
