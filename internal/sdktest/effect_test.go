package sdktest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
	"github.com/flowness/ledger/pkg/worker/effect"
)

// call is one handler call a test saw: which runner made it, for which
// intent.
type call struct {
	runner string
	effect effect.Effect
}

// calls records handler calls from any number of runners.
type calls struct {
	mu   sync.Mutex
	list []call
}

func (c *calls) handler(runner string) effect.Handler {
	return func(_ context.Context, e effect.Effect) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.list = append(c.list, call{runner, e})
		return nil
	}
}

func (c *calls) snapshot() []call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]call(nil), c.list...)
}

// keys counts the calls per idempotency key.
func (c *calls) keys() map[string]int {
	out := map[string]int{}
	for _, k := range c.snapshot() {
		out[k.effect.ID]++
	}
	return out
}

// startRunner starts an effect runner on a connection of its own, stopped
// when the test ends.
func (l *ledger) startRunner(ctx context.Context, cfg effect.Config, h effect.Handler) (*effect.Runner, jetstream.JetStream) {
	l.t.Helper()
	js := l.ns.JetStream(l.t)
	if cfg.Logger == nil {
		cfg.Logger = ledgertest.Logger()
	}
	r, err := effect.New(js, cfg, h)
	require.NoError(l.t, err)
	require.NoError(l.t, r.Start(ctx))
	l.t.Cleanup(r.Stop)
	return r, js
}

// publishCommitted publishes events of typ on task under lease and waits
// until each is committed; it returns their ids.
func publishCommitted(ctx context.Context, t *testing.T, lease *worker.Lease, task, typ string, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		p, err := lease.PublishJSON(ctx, task, typ, map[string]int{"i": i})
		require.NoError(t, err)
		require.NoError(t, p.Wait(ctx))
		ids = append(ids, p.ID())
	}
	return ids
}

// Only committed intents of the runner's types reach its handler, each with
// its event id as the key and the fence it was committed under.
func TestRunnerCallsTheHandlerForEachCommittedIntentOfItsTypes(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	c := l.client(nil, worker.Config{Holder: "payments.pod-1"})
	lease, err := c.Acquire(ctx, 2)
	require.NoError(t, err)
	intents := publishCommitted(ctx, t, lease, "order-1", "charge.requested", 3)
	publishCommitted(ctx, t, lease, "order-1", "note", 2)
	intents = append(intents, publishCommitted(ctx, t, lease, "order-1", "refund.requested", 1)...)

	var seen calls
	l.startRunner(ctx, effect.Config{Name: "payments", Types: []string{"charge.requested", "refund.requested"},
		PinnedTTL: 2 * time.Second}, seen.handler("r1"))
	require.Eventually(t, func() bool { return len(seen.snapshot()) == len(intents) }, 20*time.Second, 20*time.Millisecond)
	got := seen.snapshot()
	for i, k := range got {
		require.Equal(t, intents[i], k.effect.ID, "in log order")
		require.Equal(t, wire.Fence{Partition: 2, Holder: "payments.pod-1", Generation: lease.Generation()}, k.effect.Fence)
		require.Equal(t, "order-1", k.effect.Task)
		require.Equal(t, uint64(1), k.effect.Delivery)
	}
	time.Sleep(500 * time.Millisecond) // nothing more comes: the notes are passed over
	require.Len(t, seen.snapshot(), len(intents))
}

// A failing handler gets its effect again, with the same key, until it
// succeeds; nothing after a success is called twice.
func TestRunnerRetriesAFailedEffectWithTheSameKey(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	c := l.client(nil, worker.Config{Holder: "mail.pod-1"})
	lease, err := c.Acquire(ctx, 0)
	require.NoError(t, err)
	ids := publishCommitted(ctx, t, lease, "user-9", "mail.send", 1)

	var mu sync.Mutex
	deliveries := []uint64{}
	l.startRunner(ctx, effect.Config{Name: "mail", Types: []string{"mail.send"}, PinnedTTL: 2 * time.Second,
		RetryDelay: 50 * time.Millisecond}, func(_ context.Context, e effect.Effect) error {
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, ids[0], e.ID)
		deliveries = append(deliveries, e.Delivery)
		if len(deliveries) < 3 {
			return errors.New("mail server down")
		}
		return nil
	})
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(deliveries) == 3 }, 20*time.Second, 20*time.Millisecond)
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []uint64{1, 2, 3}, deliveries)
}

// Two processes of one runner: one is active, the other stands by. When
// the active one crashes between a handler's return and its ack, the
// standby takes over and calls that effect again with the same key, and
// every other intent once.
func TestStandbyRunnerTakesOverAndRepeatsTheUnackedEffect(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 90*time.Second)
	c := l.client(nil, worker.Config{Holder: "payments.pod-1"})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)

	var seen calls
	cfg := effect.Config{Name: "payments", Types: []string{"charge.requested"}, PinnedTTL: 2 * time.Second,
		AckWait: 2 * time.Second}
	// The first runner, alone, takes the first intent; it dies after the
	// handler returned, once the second runner stands by.
	var crashOnce sync.Once
	crashed := make(chan string, 1)
	standing := make(chan struct{})
	first := cfg
	var firstJS jetstream.JetStream
	first.BeforeAck = func(_ context.Context, e effect.Effect) error {
		err := error(nil)
		crashOnce.Do(func() {
			<-standing
			firstJS.Conn().Close() // the process dies before its ack
			crashed <- e.ID
			err = errors.New("crashed")
		})
		return err
	}
	_, firstJS = l.startRunner(ctx, first, seen.handler("first"))
	ids := publishCommitted(ctx, t, lease, "order-7", "charge.requested", 4)
	require.Eventually(t, func() bool { return len(seen.snapshot()) == 1 }, 20*time.Second, 10*time.Millisecond)
	l.startRunner(ctx, cfg, seen.handler("second"))
	close(standing)
	var lostAck string
	select {
	case lostAck = <-crashed:
	case <-ctx.Done():
		t.Fatal("the first runner never ran an effect")
	}
	require.Equal(t, ids[0], lostAck)
	require.Eventually(t, func() bool {
		k := seen.keys()
		return len(k) == len(ids) && k[lostAck] == 2
	}, 30*time.Second, 50*time.Millisecond, "every intent runs, the unacked one twice: %v", seen.keys())
	time.Sleep(time.Second)
	k := seen.keys()
	for _, id := range ids {
		want := 1
		if id == lostAck {
			want = 2
		}
		require.Equal(t, want, k[id], "calls of %s", id)
	}
	got := seen.snapshot()
	require.Equal(t, "first", got[0].runner)
	require.Equal(t, lostAck, got[0].effect.ID)
	for _, c := range got[1:] {
		require.Equal(t, "second", c.runner, "the standby runs everything after the crash")
	}
}

// While both processes of a runner live, only one of them runs effects.
func TestOnlyOneRunnerOfAConsumerIsActive(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	c := l.client(nil, worker.Config{Holder: "payments.pod-1"})
	lease, err := c.Acquire(ctx, 1)
	require.NoError(t, err)
	var seen calls
	cfg := effect.Config{Name: "payments", Types: []string{"charge.requested"}, PinnedTTL: 2 * time.Second}
	l.startRunner(ctx, cfg, seen.handler("a"))
	l.startRunner(ctx, cfg, seen.handler("b"))
	ids := publishCommitted(ctx, t, lease, "order-1", "charge.requested", 20)
	require.Eventually(t, func() bool { return len(seen.snapshot()) == len(ids) }, 20*time.Second, 20*time.Millisecond)
	runners := map[string]int{}
	for _, c := range seen.snapshot() {
		runners[c.runner]++
	}
	require.Len(t, runners, 1, "calls per runner: %v", runners)
}

func TestRunnerConfigIsChecked(t *testing.T) {
	t.Parallel()
	for _, cfg := range []effect.Config{
		{Types: []string{"x"}},
		{Name: "a.b", Types: []string{"x"}},
		{Name: "ok"},
		{Name: "ok", Types: []string{"x"}, PinnedTTL: time.Second},
		{Name: "ok", Types: []string{"x"}, Partitions: []int{-1}},
	} {
		_, err := effect.New(nil, cfg, func(context.Context, effect.Effect) error { return nil })
		require.ErrorIs(t, err, effect.ErrInvalidConfig, "%+v", cfg)
	}
}

// A runner whose consumer is deleted on the server (an operator, or a
// loss of the server's storage) makes it again and goes on: the client
// stops consuming a deleted consumer for good, and the runner must not
// stop with it. The intents committed after the deletion are performed,
// and the ones before it, delivered again from the start of LEDGER_LOG,
// come with their keys, which the handler passes downstream.
func TestRunnerMakesItsDeletedConsumerAgain(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	c := l.client(nil, worker.Config{Holder: "payments.pod-1"})
	lease, err := c.Acquire(ctx, 2)
	require.NoError(t, err)

	var seen calls
	r, js := l.startRunner(ctx, effect.Config{Name: "payments", Types: []string{"charge.requested"},
		PinnedTTL: 2 * time.Second, RetryDelay: 100 * time.Millisecond}, seen.handler("r1"))
	before := publishCommitted(ctx, t, lease, "order-1", "charge.requested", 2)
	require.Eventually(t, func() bool { return len(seen.keys()) == len(before) }, 20*time.Second, 20*time.Millisecond)

	require.NoError(t, js.DeleteConsumer(ctx, wire.StreamLog, r.Consumer()))
	after := publishCommitted(ctx, t, lease, "order-1", "charge.requested", 2)
	require.Eventually(t, func() bool {
		keys := seen.keys()
		return keys[after[0]] > 0 && keys[after[1]] > 0
	}, 20*time.Second, 20*time.Millisecond, "the intents committed after the deletion are performed")
	_, err = js.Consumer(ctx, wire.StreamLog, r.Consumer())
	require.NoError(t, err, "the consumer is there again")
	for _, id := range before {
		require.Positive(t, seen.keys()[id], id)
	}
}

// A log batch (several committed events in one LEDGER_LOG message) gets
// each of its effects called, in order, and is acked once all are done.
// When one fails, the batch comes back; the effects before it that this
// runner did already are not called again.
func TestRunnerDoesEachEffectOfALogBatchOnce(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	ctx := testCtx(t, 60*time.Second)
	subj := wire.Subjects{}
	at := time.Now()
	var copies []wire.LogCopy
	for i, typ := range []string{"charge.requested", "note", "charge.requested", "charge.requested"} {
		copies = append(copies, wire.LogCopy{Seq: int64(10 + i), EventID: ledgertest.NewID(), Partition: 2, Task: "order-1",
			Version: int64(1 + i), Type: typ, Holder: "payments.pod-1", Generation: 1, CommittedAt: at, Payload: []byte(`{"i":1}`)})
	}
	msgs, err := subj.LogBatchMsgs(copies, 1<<20)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	_, err = l.ns.JetStream(t).PublishMsg(ctx, msgs[0])
	require.NoError(t, err)

	var mu sync.Mutex
	var got []string
	failed := false
	r, js := l.startRunner(ctx, effect.Config{Name: "payments", Types: []string{"charge.requested"}, PinnedTTL: 2 * time.Second,
		RetryDelay: 50 * time.Millisecond}, func(_ context.Context, e effect.Effect) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, e.ID)
		if e.ID == copies[2].EventID && !failed {
			failed = true
			return errors.New("card network down")
		}
		return nil
	})
	want := []string{copies[0].EventID, copies[2].EventID, copies[2].EventID, copies[3].EventID}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= len(want) }, 20*time.Second, 20*time.Millisecond)
	cons, err := js.Consumer(ctx, wire.StreamLog, r.Consumer())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, 10*time.Second, 20*time.Millisecond, "the batch is acked")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, want, got, "each effect in order; the failed one again, the one before it not")
}
