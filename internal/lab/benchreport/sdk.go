package benchreport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/internal/localstack"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// pipeline is the whole ledger under load: Workers SDK clients holding the
// 16 partitions publish to the in-process ingest; a monitor connection
// watches every receipt and the bucket ledger_tasks, which the projector
// fills.
type pipeline struct {
	o    Options
	prog *progress
	load *load
	// published counts each task's versions published by earlier phases.
	published []int64

	conns   []*nats.Conn
	clients []*worker.Client
	leases  [partitions]*worker.Lease
	owner   [partitions]int // the worker holding each partition

	mon       *nats.Conn
	sub       *nats.Subscription
	watch     jetstream.KeyWatcher
	watchDone chan struct{}
	// cur is the phase the receipts and bucket values are recorded for.
	cur atomic.Pointer[tracker]

	checkMu sync.Mutex
	checks  []versionCheck // versions to check once the phase's receipts are in
}

// startPipeline connects the monitor and the workers and takes every
// partition's lease.
func startPipeline(ctx context.Context, s *localstack.Stack, o Options, id string, prog *progress) (_ *pipeline, err error) {
	l := newLoad("bench-"+id+"-", taskCount(o.Events))
	p := &pipeline{o: o, prog: prog, load: l, published: make([]int64, len(l.tasks)), watchDone: make(chan struct{})}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	url := s.NATS.ClientURL()
	if p.mon, err = nats.Connect(url, nats.Name("bench-monitor")); err != nil {
		return nil, fmt.Errorf("benchreport: connect the monitor: %w", err)
	}
	if p.sub, err = p.mon.Subscribe(wire.Subjects{}.Receipt("*.*"), p.onReceipt); err != nil {
		return nil, fmt.Errorf("benchreport: subscribe to receipts: %w", err)
	}
	_ = p.sub.SetPendingLimits(-1, -1) // a burst of receipts must never be dropped
	js, err := jetstream.New(p.mon)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, wire.BucketTasks)
	if err != nil {
		return nil, fmt.Errorf("benchreport: bucket %s: %w", wire.BucketTasks, err)
	}
	if p.watch, err = kv.WatchAll(ctx, jetstream.UpdatesOnly()); err != nil {
		return nil, fmt.Errorf("benchreport: watch bucket %s: %w", wire.BucketTasks, err)
	}
	go p.watchBucket()
	if err := p.mon.Flush(); err != nil {
		return nil, err
	}

	for w := range o.Workers {
		holder := wire.Holder("bench-"+id, fmt.Sprintf("w%d", w))
		nc, err := nats.Connect(url, nats.Name(fmt.Sprintf("bench-worker-%d", w)), worker.InboxOption(holder))
		if err != nil {
			return nil, fmt.Errorf("benchreport: connect worker %d: %w", w, err)
		}
		p.conns = append(p.conns, nc)
		c, err := worker.New(nc, worker.Config{Holder: holder,
			MaxInFlight: MaxInFlight, BatchMax: o.SDKBatchMax, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		p.clients = append(p.clients, c)
	}
	for part := range partitions {
		w := part % o.Workers
		l, err := p.clients[w].Acquire(ctx, part)
		if errors.Is(err, worker.ErrHeld) {
			return nil, fmt.Errorf("benchreport: worker %d: %w (is a ledger running on this database?)", w, err)
		}
		if err != nil {
			return nil, fmt.Errorf("benchreport: worker %d: %w", w, err)
		}
		p.leases[part], p.owner[part] = l, w
	}
	return p, nil
}

// close releases the leases and closes every connection.
func (p *pipeline) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, l := range p.leases {
		if l != nil {
			_ = l.Release(ctx)
		}
	}
	for _, c := range p.clients {
		_ = c.Close()
	}
	for _, nc := range p.conns {
		nc.Close()
	}
	if p.watch != nil {
		_ = p.watch.Stop()
		<-p.watchDone
	}
	if p.mon != nil {
		p.mon.Close()
	}
}

func (p *pipeline) onReceipt(m *nats.Msg) {
	at := time.Now().UnixNano()
	t := p.cur.Load()
	if t == nil {
		return
	}
	rs, _ := wire.ReceiptsOf(m.Header, m.Data) // the SDK's batches get batched receipts
	for _, rc := range rs {
		t.onReceipt(rc, at)
	}
}

// watchBucket records every value the projector writes, at the time the
// bucket stored it.
func (p *pipeline) watchBucket() {
	defer close(p.watchDone)
	for e := range p.watch.Updates() {
		if e == nil || e.Operation() != jetstream.KeyValuePut {
			continue
		}
		t := p.cur.Load()
		if t == nil {
			continue
		}
		var st struct {
			Version int64 `json:"version"`
		}
		if json.Unmarshal(e.Value(), &st) == nil {
			t.onValue(e.Key(), st.Version, e.Created().UnixNano())
		}
	}
}

// phase starts following a phase of counts[t] events per task.
func (p *pipeline) phase(counts []int) *tracker {
	t := newTracker(p.load, append([]int64(nil), p.published...), counts)
	p.cur.Store(t)
	for i, n := range counts {
		p.published[i] += int64(n)
	}
	return t
}

// publish publishes task's version v (the next one of the task: the SDK
// assigns versions, this checks them) and records when.
func (p *pipeline) publish(ctx context.Context, t *tracker, task int, v int64) (*worker.Pending, *sample, error) {
	s := t.sample(task, v)
	s.pub = time.Now().UnixNano()
	pd, err := p.leases[p.load.parts[task]].Publish(ctx, p.load.tasks[task], eventType, payload(v))
	if err != nil {
		return nil, nil, err
	}
	// The version is checked once the phase's receipts are in: asking for
	// it now would wait for the task's head, which Publish does not, and
	// hold this publisher to one lookup at a time, as no worker is.
	p.checkMu.Lock()
	p.checks = append(p.checks, versionCheck{pd: pd, task: task, want: v})
	p.checkMu.Unlock()
	return pd, s, nil
}

// versionCheck is a published event and the version the SDK should have
// given it.
type versionCheck struct {
	pd   *worker.Pending
	task int
	want int64
}

// checkVersions checks the versions the SDK gave the events published since
// the last check; every receipt of them is in, so each version is assigned.
func (p *pipeline) checkVersions() error {
	p.checkMu.Lock()
	checks := p.checks
	p.checks = nil
	p.checkMu.Unlock()
	for _, c := range checks {
		if got := c.pd.Version(); got != c.want {
			return fmt.Errorf("the SDK gave %s version %d, %d was expected (0: the event was not sent)", p.load.tasks[c.task], got, c.want)
		}
	}
	return nil
}

// throughput publishes Events events as fast as the SDK lets it: one
// goroutine per lease, each round robin over its partition's tasks.
func (p *pipeline) throughput(ctx context.Context, r *Report) error {
	counts := spread(p.o.Events, len(p.load.tasks))
	t := p.phase(counts)
	var byPart [partitions][]int
	for i, part := range p.load.parts {
		byPart[part] = append(byPart[part], i)
	}
	p.prog.begin("pipeline", t.total, t.receipts.Load)
	defer p.prog.end()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, partitions)
	var wg sync.WaitGroup
	cpu := startCPU()
	start := time.Now()
	for part := range partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; ; round++ {
				more := false
				for _, task := range byPart[part] {
					if round >= counts[task] {
						continue
					}
					more = true
					if _, _, err := p.publish(ctx, t, task, t.base[task]+int64(round)+1); err != nil {
						errs <- err
						cancel()
						return
					}
				}
				if !more {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("benchreport: pipeline: %w", err)
	}
	if err := t.wait(ctx, ReceiptTimeout, time.Time{}); err != nil {
		return fmt.Errorf("benchreport: pipeline: %w", err)
	}
	// Everything on the machine until the last receipt: the SDK workers,
	// NATS, the ingest, PostgreSQL and the projector, which runs here and
	// is stopped during the raw pipelines.
	cpuPerEvent := cpu.perEvent(t.total)
	if err := p.checkVersions(); err != nil {
		return fmt.Errorf("benchreport: pipeline: %w", err)
	}
	receipt, kv := t.last()
	label := fmt.Sprintf("pipeline: SDK → ingest → receipt (%d workers, fresh tasks)", p.o.Workers)
	r.SDKReceipt = throughputRow(label, t.total, time.Unix(0, receipt).Sub(start))
	r.SDKReceipt.CPUPerEvent = cpuPerEvent
	r.SDKKV = throughputRow(LabelSDKKV, t.total, time.Unix(0, kv).Sub(start))
	r.SDKFirstSecond, r.SDKSteady = firstAndRest(start, t.arrivals(func(s *sample) int64 { return s.receipt }), FirstWindow)
	return nil
}

// firstAndRest splits a run that started at start, whose events arrived at
// the given times (Unix ns), into its first window and the rest, and
// compares their rates: a fresh worker first learns each task's head, and
// a cold ingest fills its caches. The window is half the run when the run
// is shorter than two windows.
func firstAndRest(start time.Time, arrivals []int64, window time.Duration) (first, rest Row) {
	if len(arrivals) == 0 {
		return Row{}, Row{}
	}
	last := slices.Max(arrivals)
	run := time.Unix(0, last).Sub(start)
	name := "first second"
	if run < 2*window {
		window = run / 2
		name = "first " + formatLatency(window)
	}
	cut := start.Add(window).UnixNano()
	in := 0
	for _, at := range arrivals {
		if at < cut {
			in++
		}
	}
	first = throughputRow("pipeline: SDK → ingest → receipt, "+name, in, window)
	rest = throughputRow("pipeline: SDK → ingest → receipt, after the "+name, len(arrivals)-in, run-window)
	if rest.PerSecond > 0 {
		first.Relative, first.RelativeTo = first.PerSecond/rest.PerSecond, "the rest"
	}
	return first, rest
}

// ackWait is an event whose publish ack is awaited.
type ackWait struct {
	p *worker.Pending
	s *sample
}

// latency publishes rate events a second for LatencyDuration, paced, over
// the tasks the throughput phase left (their heads are known to the SDK
// and their values to the projector: the steady state), and measures each
// event's time to its ack, receipt and bucket value.
func (p *pipeline) latency(ctx context.Context, r *Report, rate int) error {
	total := latencyEvents(rate, p.o.LatencyDuration)
	tasks := len(p.load.tasks)
	t := p.phase(spread(total, tasks))
	title := fmt.Sprintf("latency @ %s/s", group(int64(rate)))
	p.prog.begin(title+": SDK", total, t.receipts.Load)
	defer p.prog.end()

	// Acks come back in publish order on each worker's connection, so one
	// waiter per worker sees each soon after it arrived.
	ackCtx, cancel := context.WithTimeout(ctx, p.o.LatencyDuration+ReceiptTimeout)
	defer cancel()
	acks := make([]chan ackWait, p.o.Workers)
	var wg sync.WaitGroup
	for w := range acks {
		acks[w] = make(chan ackWait, total)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range acks[w] {
				if ack, err := a.p.PubAck(ackCtx); err == nil && ack != nil {
					a.s.ack = time.Now().UnixNano()
				}
			}
		}()
	}
	closeAcks := sync.OnceFunc(func() {
		for _, ch := range acks {
			close(ch)
		}
		wg.Wait()
	})
	defer closeAcks()

	elapsed, err := pace(ctx, float64(rate), total, func(sent int) error {
		task := sent % tasks
		pd, s, err := p.publish(ctx, t, task, t.base[task]+int64(sent/tasks)+1)
		if err != nil {
			return err
		}
		acks[p.owner[p.load.parts[task]]] <- ackWait{pd, s}
		return nil
	})
	if err != nil {
		return fmt.Errorf("benchreport: %s: %w", title, err)
	}
	if err := t.wait(ctx, 0, time.Now().Add(ReceiptTimeout)); err != nil {
		return fmt.Errorf("benchreport: %s: %w", title, err)
	}
	if err := p.checkVersions(); err != nil {
		return fmt.Errorf("benchreport: %s: %w", title, err)
	}
	closeAcks()
	r.LatencySDKAck = latencyRow(title+": SDK publish → JetStream ack", t.latencies(func(s *sample) int64 { return s.ack }), total, elapsed)
	r.LatencySDKReceipt = latencyRow(title+": SDK publish → receipt", t.latencies(func(s *sample) int64 { return s.receipt }), total, elapsed)
	r.LatencySDKKV = latencyRow(title+": SDK publish → KV", t.latencies(func(s *sample) int64 { return s.kv }), total, elapsed)
	return nil
}
