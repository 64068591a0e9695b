package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	"github.com/flowness/ledger/pkg/worker"
)

// Writer kinds: how a writer reaches the ledger.
const (
	// WriterRaw publishes with JetStream itself and renews its lease by the
	// SDK's schedule; it re-sends only with WriterConfig.Resend.
	WriterRaw = "raw"
	// WriterSDK is a user of the Go SDK (pkg/worker): it acquires and
	// renews its lease with worker.Client and publishes with Lease.Publish,
	// so the SDK alone keeps every event until its verdict.
	WriterSDK = "sdk"
)

// SDKReceiptTimeoutDefault is the SDK writer's Config.ReceiptTimeout in a
// run: 2 s, so an event a storage loss took is looked up, and published
// again, well within a short run and within the ingests' gap window.
const SDKReceiptTimeoutDefault = 2 * time.Second

// sdkWriter is one running SDK writer: the SDK does the work, the writer
// logs what a user of it sees.
type sdkWriter struct {
	cfg WriterConfig
	c   *worker.Client
	log *logWriter
	rng *rand.Rand
	// raw performs direct effects with the raw writer's code.
	raw *writer
	// seq makes every payload distinct: the SDK picks the event ids.
	seq atomic.Int64
	// waits counts the goroutines that log an event's ack and verdict.
	waits sync.WaitGroup
}

// RunSDKWriter runs a writer that uses the Go SDK on nc until ctx ends. It
// writes the same records as RunWriter: a pub (with the version the SDK
// assigned, timed before Publish was called), the publish ack, the verdict
// (a receipt, or the ledger's answer to the SDK's lookup), grants and
// losses. It ignores Zombie (the SDK never publishes under a lease it
// lost) and Resend (the SDK re-sends by itself, Config.ReceiptTimeout).
// The SDK publishes again an event the ledger has no record of, even
// after its lease ended (the copy is then judged stale); a stopping writer
// waits up to sdkStopGrace for its events' verdicts before it closes.
func RunSDKWriter(ctx context.Context, nc *nats.Conn, cfg WriterConfig) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	rt := cfg.ReceiptTimeout
	if rt <= 0 {
		rt = SDKReceiptTimeoutDefault
	}
	c, err := worker.New(nc, worker.Config{Holder: cfg.Holder, Prefix: cfg.Prefix, Partitions: cfg.Partition + 1,
		TTL: cfg.TTL, ReceiptTimeout: rt, PublishAckTimeout: max(cfg.TTL, time.Second),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}) // into the writer's process log
	if err != nil {
		return fmt.Errorf("sdk writer: %w", err)
	}
	lw := newLogWriter(cfg.Log)
	w := &sdkWriter{cfg: cfg, c: c, log: lw, raw: &writer{cfg: cfg, log: lw},
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(cfg.Partition)))}
	p := cfg.Partition
	w.log.add(Record{Kind: KindStart, Holder: cfg.Holder, Partition: &p, Tasks: cfg.Tasks, TTLMillis: cfg.TTL.Milliseconds()})
	bg, stopBG := context.WithCancel(context.Background())
	flushed := make(chan struct{})
	go func() { defer close(flushed); w.raw.flushEvery(bg, 100*time.Millisecond) }()
	// Told to stop, the writer gives its events without a verdict until
	// sdkStopGrace to get one, as a user waits for Pending.Wait: the SDK
	// keeps looking each up, and publishes again one the ledger has no
	// record of, even after its lease ended.
	var stopBy atomic.Int64
	stopAfter := context.AfterFunc(ctx, func() { stopBy.Store(time.Now().Add(sdkStopGrace).UnixNano()) })
	defer stopAfter()
	defer func() {
		deadline := time.Now().Add(sdkStopGrace)
		if at := stopBy.Load(); at != 0 {
			deadline = time.Unix(0, at)
		}
		waitUntil(&w.waits, deadline)
		_ = c.Close() // ends the waits of events that never got a verdict
		w.waits.Wait()
		stopBG()
		<-flushed
		w.log.add(Record{Kind: KindStop})
		_ = w.log.flush()
	}()
	for ctx.Err() == nil {
		sent := time.Now()
		lease, err := c.AcquireWait(ctx, cfg.Partition)
		if err != nil {
			sleep(ctx, 50*time.Millisecond) // a mistake it cannot wait out: ask again
			continue
		}
		w.log.add(Record{Kind: KindGrant, Sent: sent.UnixNano(), Gen: lease.Generation(),
			ExpiresAt: lease.ExpiresAt().Format(time.RFC3339Nano)})
		w.hold(ctx, lease)
		w.end(lease)
	}
	return nil
}

// sdkStopGrace bounds how long a stopping SDK writer waits for its
// events' verdicts, its lease's release included: within the 15 s the run
// gives a writer after SIGTERM.
const sdkStopGrace = 12 * time.Second

// waitUntil waits for wg, or until deadline.
func waitUntil(wg *sync.WaitGroup, deadline time.Time) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// end releases the lease when the writer is told to stop, so the SDK
// keeps its events (and re-sends what the ledger has no record of) until
// their verdicts, bounded by the writer's grace; a lost lease is logged.
func (w *sdkWriter) end(lease *worker.Lease) {
	if lease.Context().Err() == nil {
		rctx, cancel := context.WithTimeout(context.Background(), sdkStopGrace)
		err := lease.Release(rctx)
		cancel()
		if err != nil && !errors.Is(err, worker.ErrLeaseLost) {
			w.log.add(Record{Kind: KindLost, Gen: lease.Generation(), Why: "release: " + err.Error()})
			return
		}
	}
	if cause := context.Cause(lease.Context()); errors.Is(cause, worker.ErrLeaseLost) {
		w.log.add(Record{Kind: KindLost, Gen: lease.Generation(), Why: cause.Error()})
	}
}

// hold publishes under lease at the writer's rate until ctx or the lease
// ends. It reads each task's head first, to give each version the type
// the raw writer gives it; Publish assigns the versions itself.
func (w *sdkWriter) hold(ctx context.Context, lease *worker.Lease) {
	lctx := lease.Context()
	gen := lease.Generation()
	next := make(map[string]int64, len(w.cfg.Tasks))
	for _, task := range w.cfg.Tasks {
		for {
			if ctx.Err() != nil || lctx.Err() != nil {
				return
			}
			h, err := w.c.TaskHead(lctx, task)
			if err == nil {
				next[task] = h.Version + 1
				w.log.add(Record{Kind: KindHead, Gen: gen, Task: task, Version: h.Version})
				break
			}
			sleep(ctx, 25*time.Millisecond)
		}
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / w.cfg.Rate))
	defer tick.Stop()
	for i := w.rng.IntN(len(w.cfg.Tasks)); ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-lctx.Done():
			return
		case <-tick.C:
		}
		task := w.cfg.Tasks[i%len(w.cfg.Tasks)]
		v, err := w.publish(ctx, lease, task, next[task])
		switch {
		case err == nil:
			next[task] = v + 1
		case errors.Is(err, worker.ErrResyncNeeded):
			// A refused event (a gap the ledger judged) stops the task
			// until the lease learns its head again, as a user would.
			rctx, cancel := context.WithTimeout(lctx, 5*time.Second)
			if h, rerr := lease.ResyncTask(rctx, task); rerr == nil {
				next[task] = h + 1
				w.log.add(Record{Kind: KindHead, Gen: gen, Task: task, Version: h})
			}
			cancel()
		}
	}
}

// publish publishes the next event of task and logs it; a goroutine logs
// its ack and its verdict when they come.
func (w *sdkWriter) publish(ctx context.Context, lease *worker.Lease, task string, version int64) (int64, error) {
	gen := lease.Generation()
	typ := typeOf(version)
	payload, _ := json.Marshal(map[string]any{"by": w.cfg.Holder, "gen": gen, "v": version,
		"n": strconv.FormatInt(w.seq.Add(1), 10) + "-" + ulid.Make().String(),
		"slot" + strconv.FormatInt(version%4, 10): version})
	t0 := time.Now()
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p, err := lease.Publish(pctx, task, typ, payload)
	if err != nil {
		return 0, err
	}
	v := p.Version()
	if v == 0 {
		_, err := p.Receipt(context.Background()) // ended unsent: says why
		return 0, cmpErr(err, errors.New("not sent"))
	}
	w.log.add(Record{Kind: KindPub, T: t0.UnixNano(), ID: p.ID(), Task: task, Version: v, Gen: gen, Type: typ, Try: 1})
	if typ == effectType && w.cfg.Downstream != nil && v == version {
		w.raw.directEffect(ctx, gen, p.ID(), false)
	}
	w.waits.Add(1)
	go func() { defer w.waits.Done(); w.follow(p) }()
	return v, nil
}

// follow logs p's publish ack and its verdict, waiting until the client
// closes.
func (w *sdkWriter) follow(p *worker.Pending) {
	ack, err := p.PubAck(context.Background())
	switch {
	case err != nil:
		w.log.add(Record{Kind: KindNack, ID: p.ID(), Err: err.Error()})
	case ack != nil:
		w.log.add(Record{Kind: KindAck, ID: p.ID(), Seq: ack.Sequence, Dup: ack.Duplicate})
	}
	r, err := p.Receipt(context.Background())
	if err != nil {
		return
	}
	w.log.add(Record{Kind: KindReceipt, ID: r.EventID, Task: r.Task, Version: r.Version, Gen: r.Generation,
		Verdict: string(r.Verdict), Reason: r.Reason, Seq: uint64(max(r.Seq, 0))})
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
