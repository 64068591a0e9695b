package ingest_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// startIngestOn starts one more ingest process on its own connection and
// store, and returns the connection so that a test can cut it.
func (e *env) startIngestOn(cfg ingest.Config, store *fence.Store) (*ingest.Service, *nats.Conn) {
	e.t.Helper()
	nc := e.ns.Conn(e.t)
	svc, err := ingest.New(cfg, ingest.Deps{NC: nc, Store: store, Logger: ledgertest.Logger()})
	require.NoError(e.t, err)
	require.NoError(e.t, svc.Start(context.Background()))
	e.t.Cleanup(svc.Stop)
	return svc, nc
}

// newBareEnv is a test's database and NATS server with no ingest yet.
func newBareEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, db: dbtest.New(t), ns: natstest.Start(t)}
	var err error
	e.store, err = fence.New(e.db.Pool, fence.Config{})
	require.NoError(t, err)
	e.nc, e.js = e.ns.Conn(t), e.ns.JetStream(t)
	return e
}

// An ingest dies (kill -9) holding version 1 of a task. Versions 2 and 3,
// published after it, reach the other ingest and wait. Their gap window
// (1 s) closes before AckWait (2 s) hands version 1 on: they must still not
// be judged gap, since version 1 was published and acknowledged before them
// and is still queued. All three commit.
func TestCrashedIngestsPredecessorIsNotTurnedIntoGap(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	holding := make(chan struct{}, 1)
	p1cfg := ingest.WithTestHooks(ingest.Config{AckWait: 2 * time.Second, GapWindow: time.Second, StopTimeout: time.Second},
		ingest.TestHooks{BeforeAppend: func(ctx context.Context) {
			select {
			case holding <- struct{}{}:
			default:
			}
			<-ctx.Done() // frozen until the test ends
		}})
	_, p1conn := e.startIngestOn(p1cfg, e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(0, "worker-a.1", 120000)

	ev := func(v int64) event {
		return event{id: newID(), partition: 0, task: "crash", holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	v1 := ev(1)
	e.publish(v1)
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the first ingest never took version 1")
	}
	p1conn.Close() // kill -9: no ack, no nak, no progress from it again

	e.startIngestOn(ingest.Config{AckWait: 2 * time.Second, GapWindow: time.Second}, e.store)
	v2, v3 := ev(2), ev(3)
	e.publish(v2)
	e.publish(v3)

	for _, x := range []event{v1, v2, v3} {
		r := receiptFor(t, rc, x.id)
		require.Equal(t, wire.VerdictCommitted, r.Verdict, "version %d: %+v", x.version, r)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM ledger.rejections`))
}

// An ingest whose database is cut holds a batch, a full lane and more
// messages JetStream already sent it. Nothing of it may reach the other
// ingest by redelivery (its held messages get progress acks; the ones it
// cannot queue it hands back at once), so when the database returns every
// event has exactly one receipt, committed, and no event was judged gap
// while its predecessor was in hand.
func TestStalledIngestKeepsItsMessagesAndEveryEventGetsOneVerdict(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	proxy := faultproxy.Start(t, "127.0.0.1:5432")
	p1store, err := fence.New(e.db.PoolVia(t, proxy.Addr()), fence.Config{})
	require.NoError(t, err)
	cfg := ingest.Config{AckWait: 1500 * time.Millisecond, GapWindow: 2 * time.Second, BatchSize: 4, Lanes: 1,
		RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond}
	e.startIngestOn(cfg, p1store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(2, "worker-a.1", 120000)

	proxy.Cut()
	var ids []string
	for v := int64(1); v <= 24; v++ {
		x := event{id: newID(), partition: 2, task: "stall", holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
		ids = append(ids, x.id)
		e.msgAsync(x)
	}
	e.waitAsync()
	time.Sleep(500 * time.Millisecond) // the first ingest has taken what it can
	e.startIngestOn(cfg, e.store)
	time.Sleep(5 * time.Second) // > 3 AckWaits and > the gap window
	proxy.Restore()

	for i, id := range ids {
		r := receiptFor(t, rc, id)
		require.Equal(t, wire.VerdictCommitted, r.Verdict, "version %d: %+v", i+1, r)
	}
	require.Eventually(t, func() bool { return e.streamPending(wire.StreamIn) == 0 }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // late receipts of a second delivery would arrive by now
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for i, id := range ids {
		require.Len(t, rc.byID[id], 1, "version %d got %d receipts: %+v", i+1, len(rc.byID[id]), rc.byID[id])
	}
	require.Equal(t, 24, e.count(`SELECT count(*) FROM ledger.events`))
}

// Stop returns within its timeout even when the database is away and the
// lanes and the client's buffer are full; what is in hand goes back.
func TestStopReturnsWhileTheDatabaseIsAway(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	proxy := faultproxy.Start(t, "127.0.0.1:5432")
	store, err := fence.New(e.db.PoolVia(t, proxy.Addr()), fence.Config{})
	require.NoError(t, err)
	svc, _ := e.startIngestOn(ingest.Config{BatchSize: 2, Lanes: 1, StopTimeout: time.Second}, store)
	l := e.acquire(1, "worker-a.1", 120000)
	proxy.Cut()
	for v := int64(1); v <= 200; v++ {
		e.msgAsync(event{id: newID(), partition: 1, task: "stop", holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: `{}`})
	}
	e.waitAsync()
	time.Sleep(300 * time.Millisecond)

	stopped := make(chan struct{})
	go func() { svc.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(15 * time.Second):
		t.Fatal("Stop did not return with the database away")
	}
	svc.Stop() // a second Stop returns at once
	proxy.Restore()

	// The messages it handed back are committed by the next ingest.
	e.startIngestOn(ingest.Config{}, e.store)
	require.Eventually(t, func() bool { return e.count(`SELECT count(*) FROM ledger.events`) == 200 }, 30*time.Second, 50*time.Millisecond)
}

// Stop without Start returns, and so does a second Stop.
func TestStopWithoutStart(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	svc, err := ingest.New(ingest.Config{}, ingest.Deps{NC: e.nc, Store: e.store, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	svc.Stop()
	svc.Stop()
}

// A message at NATS's size limit, and one with 60 KB of headers, are valid
// on LEDGER_IN but would make dead letters too large to store. Each gets its
// verdict and a dead letter that fits (body cut, headers dropped, each
// recorded), and a valid event behind them in the same lane commits.
func TestOversizedMessagesGetDeadLettersThatFit(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	e.svc, _ = e.startIngestOn(ingest.Config{Lanes: 1}, e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(3, "worker-a.1", 120000)

	bigBody := event{id: newID(), partition: 3, task: "big", holder: "worker-a.1", generation: l.Generation,
		version: 1, typ: "bad type!", payload: ""}
	m := e.msg(bigBody)
	hdr := 0
	for k, vs := range m.Header {
		for _, v := range vs {
			hdr += len(k) + len(v) + 4
		}
	}
	m.Data = make([]byte, int(e.nc.MaxPayload())-hdr-64)
	e.publishMsg(m)

	bigHeader := event{id: newID(), partition: 3, task: "bighdr", holder: "worker-a.1", generation: l.Generation,
		version: 1, typ: "step", payload: `{}`}
	m = e.msg(bigHeader)
	m.Header.Set("X-Padding", strings.Repeat("h", 60<<10)) // JetStream takes at most 64 KiB of headers
	e.publishMsg(m)

	ok := event{id: newID(), partition: 3, task: "after", holder: "worker-a.1", generation: l.Generation,
		version: 1, typ: "step", payload: `{"ok":true}`}
	e.publish(ok)

	r := receiptFor(t, rc, ok.id)
	require.Equal(t, wire.VerdictCommitted, r.Verdict)
	r = receiptFor(t, rc, bigBody.id)
	require.Equal(t, wire.VerdictInvalid, r.Verdict)
	r = receiptFor(t, rc, bigHeader.id)
	require.Equal(t, wire.VerdictInvalid, r.Verdict)
	require.Equal(t, wire.ReasonHeadersTooLarge, r.Reason)

	letters := e.streamMsgs(wire.StreamDLQ, "")
	require.Len(t, letters, 2)
	byTask := map[string]nats.Header{}
	for _, lm := range letters {
		task := strings.TrimPrefix(lm.Subject(), e.subj.DLQ(3, ""))
		byTask[task] = lm.Headers()
		if task == "big" {
			n, err := strconv.Atoi(lm.Headers().Get(wire.HeaderTruncated))
			require.NoError(t, err)
			require.Greater(t, n, len(lm.Data()), "the body was cut and its size recorded")
		}
	}
	require.Equal(t, bigBody.id, wire.EventIDOf(byTask["big"].Get(wire.HeaderMsgID)))
	require.NotEmpty(t, byTask["bighdr"].Get(wire.HeaderHeadersDropped))
	require.Empty(t, byTask["bighdr"].Get("X-Padding"))
}

// A dead letter never carries a worker's own Ledger-Verdict or
// Ledger-Current-* headers as if the ledger had written them.
func TestDeadLetterDoesNotCarryForgedLedgerHeaders(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	e.svc, _ = e.startIngestOn(ingest.Config{}, e.store)
	rc := e.receipts("worker-a.1")
	x := event{id: newID(), partition: 4, task: "forged", holder: "worker-a.1", generation: 7, version: 1, typ: "step", payload: `{}`}
	m := e.msg(x)
	m.Header.Set(wire.HeaderVerdict, "committed")
	m.Header.Set(wire.HeaderCurrentHolder, "somebody-else")
	m.Header.Set(wire.HeaderCurrentGeneration, "99")
	e.publishMsg(m)
	require.Equal(t, wire.VerdictStale, receiptFor(t, rc, x.id).Verdict)
	letters := e.streamMsgs(wire.StreamDLQ, "")
	require.Len(t, letters, 1)
	h := letters[0].Headers()
	require.Equal(t, []string{"stale"}, h.Values(wire.HeaderVerdict))
	require.Empty(t, h.Values(wire.HeaderCurrentHolder), "no lease: the ledger wrote none")
	require.Empty(t, h.Values(wire.HeaderCurrentGeneration))
}

// One holder floods the ledger with events ahead of their heads. A version
// beyond MaxAhead is judged at once; the others are never judged for the
// flood: at most the holder's cap of them wait in memory, the rest go back
// to JetStream and come again later. Another holder's event commits
// meanwhile, and once the missing versions arrive every waiting event
// commits.
func TestGapFloodIsBoundedAndJudgesNothing(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	e.svc, _ = e.startIngestOn(ingest.Config{MaxWaitingPerPrincipal: 4, GapWindow: time.Minute, Lanes: 1}, e.store)
	flood := e.receipts("flooder.1")
	honest := e.receipts("worker-b.1")
	lf := e.acquire(5, "flooder.1", 120000)
	lh := e.acquire(6, "worker-b.1", 120000)

	far := event{id: newID(), partition: 5, task: "far", holder: "flooder.1", generation: lf.Generation,
		version: fence.MaxAheadDefault + 2, typ: "step", payload: `{}`}
	e.publish(far)
	r := receiptFor(t, flood, far.id)
	require.Equal(t, wire.VerdictGap, r.Verdict)
	require.Equal(t, wire.ReasonTooFarAhead, r.Reason)

	ev := func(i int, v int64) event {
		return event{id: newID(), partition: 5, task: fmt.Sprintf("ahead-%d", i), holder: "flooder.1", generation: lf.Generation,
			version: v, typ: "step", payload: `{}`}
	}
	var ids []string
	for i := range 40 {
		x := ev(i, 2)
		ids = append(ids, x.id)
		e.msgAsync(x)
	}
	e.waitAsync()
	ok := event{id: newID(), partition: 6, task: "honest", holder: "worker-b.1", generation: lh.Generation, version: 1, typ: "step", payload: `{}`}
	e.publish(ok)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, honest, ok.id).Verdict)

	require.Eventually(t, func() bool { return ingest.Waiting(e.svc) == 4 }, 10*time.Second, 10*time.Millisecond,
		"the holder's cap of early events should wait in memory")
	time.Sleep(time.Second)
	require.LessOrEqual(t, ingest.Waiting(e.svc), 4)
	require.Equal(t, 1, flood.count(), "only the version beyond MaxAhead may be judged")

	for i := range 40 {
		x := ev(i, 1)
		ids = append(ids, x.id)
		e.msgAsync(x)
	}
	e.waitAsync()
	for _, id := range ids {
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, flood, id).Verdict)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM ledger.rejections WHERE reason <> 'too_far_ahead'`))
}

// A batch's log copy whose publish is lost is published again; the next
// batch's copy of the same task must not be stored before it, so LEDGER_LOG
// keeps the task's commit order.
func TestLogCopiesKeepCommitOrderAcrossARepublish(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	var dropped atomic.Bool
	cfg := ingest.WithTestHooks(ingest.Config{Lanes: 1, BatchSize: 1, PublishTimeout: 500 * time.Millisecond},
		ingest.TestHooks{DropCopy: func(m *nats.Msg) bool {
			return m.Header.Get(wire.HeaderVersion) == "1" && dropped.CompareAndSwap(false, true)
		}})
	e.svc, _ = e.startIngestOn(cfg, e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(7, "worker-a.1", 120000)
	var ids []string
	for v := int64(1); v <= 3; v++ {
		x := event{id: newID(), partition: 7, task: "order", holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: `{}`}
		ids = append(ids, x.id)
		e.msgAsync(x)
	}
	e.waitAsync()
	for _, id := range ids {
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, id).Verdict)
	}
	require.True(t, dropped.Load())
	require.Equal(t, []string{"1", "2", "3"}, e.logVersions(7, "order"))
}

// An ingest commits version 1 of a task and dies before its log copy is
// stored. Version 2 reaches the other ingest and commits at once: its copy
// must not be stored before version 1's, so that ingest stores version 1's
// copy (read from PostgreSQL) first.
func TestLogCopiesKeepCommitOrderAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	cfg, rc, ev := e.ingestDiedBeforeCopy("handover")

	e.startIngestOn(cfg, e.store)
	v2 := ev("handover", 2)
	e.publish(v2)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, v2.id).Verdict)
	require.Equal(t, []string{"1", "2"}, e.logVersions(8, "handover"), "version 2's copy was stored before version 1's")
}

// Large events make short batches: a batch stops growing once its payloads
// reach MaxBatchBytes, so it holds its lease rows only briefly and a
// takeover does not wait behind 500 large events.
func TestLargeEventsMakeShortBatches(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	reg := prometheus.NewRegistry()
	svc, err := ingest.New(ingest.Config{Lanes: 1, MaxBatchBytes: 256 << 10, BatchWait: 50 * time.Millisecond},
		ingest.Deps{NC: e.ns.Conn(t), Store: e.store, Logger: ledgertest.Logger(), Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, streams.Apply(context.Background(), e.js, streams.Options{}))
	l, err := e.store.Acquire(context.Background(), 9, "worker-a.1", 2*time.Minute)
	require.NoError(t, err)
	big := `{"blob":"` + strings.Repeat("x", 64<<10) + `"}`
	for v := int64(1); v <= 40; v++ {
		e.msgAsync(event{id: newID(), partition: 9, task: fmt.Sprintf("big-%d", v), holder: "worker-a.1",
			generation: l.Generation, version: 1, typ: "step", payload: big})
	}
	e.waitAsync()
	require.NoError(t, svc.Start(context.Background())) // the whole backlog is there at once
	t.Cleanup(svc.Stop)
	require.Eventually(t, func() bool { return e.count(`SELECT count(*) FROM ledger.events`) == 40 }, 30*time.Second, 20*time.Millisecond)

	// The batch-size histogram is observed once a batch's acks are done,
	// a moment after its rows are visible: wait until all 40 are counted.
	var h *dto.Histogram
	require.Eventually(t, func() bool {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "ledger_ingest_batch_size" {
				h = f.GetMetric()[0].GetHistogram()
			}
		}
		return h != nil && h.GetSampleSum() == 40
	}, 10*time.Second, 20*time.Millisecond, "the batch sizes do not add up to the 40 events")
	// The largest batch is at most the first bucket bound that holds
	// every batch.
	largest := math.Inf(1)
	for _, b := range h.GetBucket() {
		if b.GetCumulativeCount() == h.GetSampleCount() {
			largest = b.GetUpperBound()
			break
		}
	}
	require.LessOrEqual(t, largest, 4.0, "a batch took more than 4 events of 64 KiB under a 256 KiB bound (%d batches)", h.GetSampleCount())
}

// Several ingests share the partitions: one that joins takes its share
// from the others, and when one stops the others take its partitions over.
// Every partition is decided by exactly one ingest at a time.
func TestPartitionsSpreadOverIngestsAndMoveWhenOneStops(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	cfg := ingest.Config{ClaimTTL: 600 * time.Millisecond}
	a, _ := e.startIngestOn(cfg, e.store)
	require.Len(t, a.Partitions(), 16, "alone, an ingest decides every partition")
	b, _ := e.startIngestOn(cfg, e.store)
	require.Eventually(t, func() bool { return len(a.Partitions()) == 8 && len(b.Partitions()) == 8 }, 10*time.Second,
		20*time.Millisecond, "a=%v b=%v", a.Partitions(), b.Partitions())
	require.Empty(t, intersect(a.Partitions(), b.Partitions()))

	b.Stop()
	require.Eventually(t, func() bool { return len(a.Partitions()) == 16 }, 10*time.Second, 20*time.Millisecond,
		"a=%v", a.Partitions())
	rc := e.receipts("worker-a.1")
	l := e.acquire(3, "worker-a.1", 120000)
	x := event{id: newID(), partition: 3, task: "moved", holder: "worker-a.1", generation: l.Generation, version: 1, typ: "step", payload: `{}`}
	e.publish(x)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, x.id).Verdict)
}

func intersect(a, b []int) []int {
	var out []int
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// An ingest told to require synchronous replication refuses to start on a
// database without it, and says why; one that requires a local durable
// commit starts on the same database.
func TestIngestRefusesADatabaseBelowTheRequiredDurability(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	d, err := e.store.ReadDurability(context.Background())
	require.NoError(t, err)
	require.Equal(t, fence.DurabilityLocal, d.Level, "the test server has fsync and synchronous_commit on and no standby: %+v", d)

	svc, err := ingest.New(ingest.Config{RequireDurability: fence.DurabilitySync}, ingest.Deps{NC: e.ns.Conn(t), Store: e.store, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	err = svc.Start(context.Background())
	require.ErrorContains(t, err, `below the required "sync"`)
	require.ErrorContains(t, err, "synchronous replication")

	ok, _ := e.startIngestOn(ingest.Config{RequireDurability: fence.DurabilityLocal}, e.store)
	require.NoError(t, ok.CheckDurability(context.Background()))
}

// After a failover the ledger wrote to a newer primary (timeline 2, as the
// witness records); the database here is an old primary on timeline 1 that
// came back writable. The ingest commits and grants nothing on it and is
// not ready; without the guard it commits.
func TestIngestCommitsNothingOnASupersededPrimary(t *testing.T) {
	t.Parallel()
	for _, guarded := range []bool{true, false} {
		t.Run(fmt.Sprintf("guarded=%v", guarded), func(t *testing.T) {
			e := newBareEnv(t)
			cfg, err := streams.Bucket(wire.BucketWitness, streams.Options{})
			require.NoError(t, err)
			kv, err := e.js.CreateOrUpdateKeyValue(context.Background(), cfg)
			require.NoError(t, err)
			_, err = kv.PutString(context.Background(), "timeline", "2")
			require.NoError(t, err)
			// A lease granted before the failover, on this server.
			l, err := e.store.Acquire(context.Background(), 3, "worker-a.1", time.Minute)
			require.NoError(t, err)

			fcfg := fence.Config{}
			if guarded {
				fcfg.Primary = &fence.PrimaryGuard{}
			}
			store, err := fence.New(e.db.Pool, fcfg)
			require.NoError(t, err)
			svc, _ := e.startIngestOn(ingest.Config{}, store)
			rc := e.receipts("worker-a.1")
			x := event{id: newID(), partition: 3, task: "old-primary", holder: "worker-a.1", generation: l.Generation,
				version: 1, typ: "step", payload: `{}`}
			e.publish(x)
			if !guarded {
				require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, x.id).Verdict)
				return
			}
			require.ErrorIs(t, svc.CheckPrimary(context.Background()), fence.ErrSupersededPrimary)
			_, err = store.Acquire(context.Background(), 4, "worker-b.1", time.Minute)
			require.ErrorIs(t, err, fence.ErrSupersededPrimary)
			time.Sleep(2 * time.Second)
			require.Zero(t, rc.count(), "no verdict on a superseded primary")
			require.Zero(t, e.count(`SELECT count(*) FROM ledger.events`))
			require.EqualValues(t, 1, e.streamPending(wire.StreamIn), "the event waits in LEDGER_IN for the newest primary")
		})
	}
}

// The database comes back without the newest commits the ledger
// acknowledged (an asynchronous failover lost its tail). A writer resumes
// from the head it reads there and sends another version 3. The ingest
// notices before anything commits, commits nothing, and is not ready;
// without the check the new version 3 takes the place of the lost one.
func TestNothingCommitsOnADatabaseThatForgotAcknowledgedCommits(t *testing.T) {
	t.Parallel()
	// newest: the database lacks the newest commit. older: it lacks an
	// older one and holds the newest, as when two lanes' copies were stored
	// in another order than their commits reached a standby. Switch for
	// older: memoryWindow = 1 in forgotten.go (the newest copy only).
	//
	// batched: LEDGER_LOG holds the newest commit in a log batch (a newer
	// ingest's writer), not in a copy of its own. Switch: directBatch
	// without its batched call (forgotten.go).
	for _, tc := range []struct {
		forget  string
		checked bool
		batched bool
	}{{"newest", true, false}, {"newest", false, false}, {"older", true, false}, {"newest", true, true}} {
		t.Run(fmt.Sprintf("forget=%s/checked=%v/batched=%v", tc.forget, tc.checked, tc.batched), func(t *testing.T) {
			e := newBareEnv(t)
			cfg := ingest.WithTestHooks(ingest.Config{}, ingest.TestHooks{NoMemoryCheck: !tc.checked})
			first, _ := e.startIngestOn(cfg, e.store)
			rc := e.receipts("worker-a.1")
			l := e.acquire(2, "worker-a.1", 120000)
			ev := func(v int64, body string) event {
				return event{id: newID(), partition: 2, task: "lost-tail", holder: "worker-a.1", generation: l.Generation,
					version: v, typ: "step", payload: body}
			}
			for v := int64(1); v <= 3; v++ {
				x := ev(v, fmt.Sprintf(`{"v":%d}`, v))
				e.publish(x)
				require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, x.id).Verdict)
			}
			first.Stop()
			if tc.batched {
				e.moveIntoLogBatch(2, "lost-tail")
			}
			forget := []string{
				// The database forgets version 3, as a lagging standby would.
				`DELETE FROM ledger.event_ids WHERE seq = (SELECT max(seq) FROM ledger.events)`,
				`DELETE FROM ledger.events WHERE seq = (SELECT max(seq) FROM ledger.events)`,
				`UPDATE ledger.heads SET version = 2, seq = (SELECT max(seq) FROM ledger.events) WHERE task_id = 'lost-tail'`,
			}
			next := ev(3, `{"v":"other"}`)
			if tc.forget == "older" {
				forget = []string{
					`DELETE FROM ledger.event_ids WHERE seq = (SELECT seq FROM ledger.events WHERE version = 2)`,
					`DELETE FROM ledger.events WHERE version = 2`,
				}
				next = ev(4, `{"v":4}`)
			}
			for _, q := range forget {
				_, err := e.db.Pool.Exec(context.Background(), q)
				require.NoError(t, err, q)
			}
			store, err := fence.New(e.db.Pool, fence.Config{})
			require.NoError(t, err)
			second, _ := e.startIngestOn(cfg, store)
			e.publish(next)
			if !tc.checked {
				require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, next.id).Verdict, "the negative control commits over the lost version")
				return
			}
			require.ErrorContains(t, second.CheckMemory(context.Background()), "forgot commits the ledger acknowledged")
			time.Sleep(2 * time.Second)
			require.Zero(t, e.count(`SELECT count(*) FROM ledger.events WHERE event_id = $1`, next.id))
			require.EqualValues(t, 1, e.streamPending(wire.StreamIn), "the event waits in LEDGER_IN")
		})
	}
}

// The memory check asks LEDGER_LOG for its newest copies and waits for the
// reply. A request lost with its server (killed just after it was sent)
// gets no reply: the check gives up after its bound and says so, so the
// lanes that wait on it try again instead of waiting for ever. Switch: the
// bound (verifyTimeout in forgotten.go) off; the check then never returns.
func TestTheMemoryCheckGivesUpOnALostReply(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	first, _ := e.startIngestOn(ingest.Config{}, e.store)
	rc := e.receipts("worker-a.1")
	l := e.acquire(2, "worker-a.1", 120000)
	x := event{id: newID(), partition: 2, task: "lost-reply", holder: "worker-a.1", generation: l.Generation,
		version: 1, typ: "step", payload: `{}`}
	e.publish(x)
	require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, x.id).Verdict)
	first.Stop()

	// LEDGER_LOG holds a copy now, so a new ingest checks the database
	// against it, and its request is lost.
	second, _ := e.startIngestOn(ingest.WithTestHooks(ingest.Config{}, ingest.TestHooks{DropDirectGet: true}), e.store)
	done := make(chan error, 1)
	go func() { done <- second.CheckMemory(context.Background()) }()
	select {
	case err := <-done:
		require.ErrorContains(t, err, "read LEDGER_LOG's newest copies")
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(30 * time.Second):
		t.Fatal("the memory check still waits for a reply that will never come")
	}
}
