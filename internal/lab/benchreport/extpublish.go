package benchreport

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/oklog/ulid/v2"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// sdkPublisher publishes a worker's share through the Go SDK, one lease
// per partition, as any worker built on pkg/worker does.
type sdkPublisher struct {
	nc     *nats.Conn
	c      *worker.Client
	share  *load
	leases map[int]*worker.Lease
}

func newSDKPublisher(ctx context.Context, nc *nats.Conn, o WorkerOptions, share *load) (_ *sdkPublisher, err error) {
	p := &sdkPublisher{nc: nc, share: share, leases: map[int]*worker.Lease{}}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.c, err = worker.New(nc, worker.Config{Holder: o.holder(), MaxInFlight: MaxInFlight, BatchMax: o.SDKBatchMax,
		Logger: o.Logger}); err != nil {
		return nil, err
	}
	for part := o.Worker; part < partitions; part += o.Workers {
		l, err := p.c.Acquire(ctx, part)
		if err != nil {
			return nil, fmt.Errorf("acquire partition %d: %w", part, err)
		}
		p.leases[part] = l
	}
	return p, nil
}

// publish publishes from one goroutine per lease, round robin over the
// lease's tasks; another goroutine per lease waits for the receipts in
// publish order. Versions are the SDK's to assign (a new task's first
// events wait for its head); each is checked once its receipt is in.
func (p *sdkPublisher) publish(ctx context.Context, counts []int, rate float64) (runTimes, error) {
	if rate > 0 {
		return p.paced(ctx, counts, rate)
	}
	byPart := map[int][]int{}
	for i, part := range p.share.parts {
		byPart[part] = append(byPart[part], i)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var times noteTimes
	var wg sync.WaitGroup
	times.published(time.Now())
	type sent struct {
		pd      *worker.Pending
		version int64
	}
	for part, lease := range p.leases {
		pending := make(chan sent, MaxInFlight)
		wg.Add(2)
		go func() {
			defer wg.Done()
			defer close(pending)
			for round := 0; ; round++ {
				more := false
				for _, task := range byPart[part] {
					if round >= counts[task] {
						continue
					}
					more = true
					// ctx, not the lease's: it ends with the process too,
					// and when the run fails.
					pd, err := lease.Publish(ctx, p.share.tasks[task], eventType, payload(int64(round+1)))
					if err != nil {
						cancel(fmt.Errorf("publish %s: %w", p.share.tasks[task], err))
						return
					}
					// An event published in the first window may get its
					// receipt in it: its own waiter notes when. Waiting in
					// publish order would note it only once every earlier
					// event of the lease has its receipt, and a task whose
					// head came late would hold back the others'.
					if times.inWindow(time.Now()) {
						go func() {
							select {
							case <-pd.Done():
								times.receivedEarly(time.Now())
							case <-ctx.Done():
							}
						}()
					}
					select {
					case pending <- sent{pd, int64(round + 1)}:
					case <-ctx.Done():
						return
					}
				}
				if !more {
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			// Receipts arrive about in publish order: once the last one
			// waited for is in, every one is.
			defer func() { times.receivedLast(time.Now()) }()
			for s := range pending {
				if err := s.pd.Wait(ctx); err != nil {
					cancel(fmt.Errorf("receipt of %s: %w", s.pd.Task(), err))
					return
				}
				if v := s.pd.Version(); v != s.version {
					cancel(fmt.Errorf("the SDK gave %s version %d, %d was expected", s.pd.Task(), v, s.version))
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return runTimes{}, err
	}
	return times.times(), nil
}

// paced publishes at rate events a second, round robin over the share's
// tasks as the raw publisher does, and measures each event from the call
// to Publish to its receipt. A warm-up first publishes each task's
// version 1 and waits for its receipt, outside the count and the timing:
// the latencies are those of a worker whose tasks' heads it knows, the
// steady state.
func (p *sdkPublisher) paced(ctx context.Context, counts []int, rate float64) (runTimes, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var warm []*worker.Pending
	for task, name := range p.share.tasks {
		pd, err := p.leases[p.share.parts[task]].Publish(ctx, name, eventType, payload(1))
		if err != nil {
			return runTimes{}, fmt.Errorf("warm-up: publish %s: %w", name, err)
		}
		warm = append(warm, pd)
	}
	for _, pd := range warm {
		if err := pd.Wait(ctx); err != nil {
			return runTimes{}, fmt.Errorf("warm-up: receipt of %s: %w", pd.Task(), err)
		}
	}
	var order []int // the tasks in publish order
	for round, more := 0, true; more; round++ {
		more = false
		for task, n := range counts {
			if round < n {
				order, more = append(order, task), true
			}
		}
	}
	var times noteTimes
	lat := &histogram{}
	var wg sync.WaitGroup
	times.published(time.Now())
	_, err := pace(ctx, rate, len(order), func(i int) error {
		task := order[i]
		start := time.Now()
		pd, err := p.leases[p.share.parts[task]].Publish(ctx, p.share.tasks[task], eventType, payload(2))
		if err != nil {
			return fmt.Errorf("publish %s: %w", p.share.tasks[task], err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pd.Wait(ctx); err != nil {
				cancel(fmt.Errorf("receipt of %s: %w", pd.Task(), err))
				return
			}
			now := time.Now()
			lat.add(now.Sub(start))
			times.received(now)
		}()
		return nil
	})
	if err != nil {
		cancel(err)
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return runTimes{}, err
	}
	rt := times.times()
	rt.lat = lat
	return rt, nil
}

func (p *sdkPublisher) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, l := range p.leases {
		_ = l.Release(ctx)
	}
	if p.c != nil {
		_ = p.c.Close()
	}
	p.nc.Close()
}

// rawPublisher publishes a worker's share as raw JetStream messages with
// the contract's headers, no SDK: the leases are asked for and renewed by
// hand, the longest TTL the service grants, and the receipts counted off
// the holder's receipt subject.
type rawPublisher struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	o      WorkerOptions
	src    *rawSource
	gens   map[int]int64
	renew  context.CancelFunc
	renewd chan struct{}
}

// rawLeaseTTL is the raw publishers' lease TTL, the longest there is;
// renewed every third of it.
const rawLeaseTTL = wire.TTLMaxMillis * time.Millisecond

func newRawPublisher(ctx context.Context, nc *nats.Conn, o WorkerOptions, share *load) (_ *rawPublisher, err error) {
	p := &rawPublisher{nc: nc, o: o, gens: map[int]int64{}, renewd: make(chan struct{})}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(RawInFlight)); err != nil {
		return nil, err
	}
	var gens [partitions]int64
	for part := o.Worker; part < partitions; part += o.Workers {
		var rep wire.LeaseReply
		req := wire.LeaseRequest{Partition: &part, TTLMillis: new(int64(wire.TTLMaxMillis)), RequestID: ulid.Make().String()}
		if err := p.request(ctx, wire.LeaseAcquire, req, &rep); err != nil {
			return nil, fmt.Errorf("acquire partition %d: %w", part, err)
		}
		p.gens[part], gens[part] = rep.Generation, rep.Generation
	}
	p.src = newRawSource(wire.Subjects{}, share, o.holder(), gens)
	rctx, cancel := context.WithCancel(context.Background())
	p.renew = cancel
	go p.renewLoop(rctx)
	return p, nil
}

// request asks the lease service op for the worker's holder.
func (p *rawPublisher) request(ctx context.Context, op string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := p.nc.RequestWithContext(rctx, wire.Subjects{}.Lease(op, p.o.holder()), b)
	if err != nil {
		return fmt.Errorf("lease %s: %w", op, err)
	}
	if resp.Header.Get(micro.ErrorCodeHeader) != "" {
		return fmt.Errorf("lease %s refused: %s %s", op, resp.Header.Get(micro.ErrorHeader), resp.Data)
	}
	if err := json.Unmarshal(resp.Data, out); err != nil {
		return fmt.Errorf("lease %s: decode the reply: %w", op, err)
	}
	return nil
}

// renewLoop keeps the leases for as long as the worker runs.
func (p *rawPublisher) renewLoop(ctx context.Context) {
	defer close(p.renewd)
	t := time.NewTicker(rawLeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for part, gen := range p.gens {
			var rep wire.LeaseReply
			req := wire.LeaseRequest{Partition: &part, Generation: &gen, TTLMillis: new(int64(wire.TTLMaxMillis))}
			// A refused renewal shows in the receipts: stale, and the run fails.
			_ = p.request(ctx, wire.LeaseRenew, req, &rep)
		}
	}
}

// publish publishes the share's events round robin over its tasks, with
// at most RawInFlight awaiting their JetStream ack, and counts the commit
// receipts off the holder's receipt subject.
func (p *rawPublisher) publish(ctx context.Context, counts []int, rate float64) (runTimes, error) {
	total := 0
	for _, n := range counts {
		total += n
	}
	var times noteTimes
	var lat *histogram
	if rate > 0 {
		lat = &histogram{}
	}
	var mu sync.Mutex
	waiting := make(map[string]int64, total) // event id → when it was published (Unix ns)
	received := 0
	var refusal error
	done := make(chan struct{})
	sub, err := p.nc.Subscribe(wire.Subjects{}.Receipt(p.o.holder()), func(m *nats.Msg) {
		at := time.Now()
		rc, err := wire.DecodeReceipt(m.Data)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			refusal = cmp.Or(refusal, fmt.Errorf("a receipt that does not decode: %w", err))
		case waiting[rc.EventID] == 0:
			return // a repeated receipt, or another run's
		case rc.Verdict != wire.VerdictCommitted && rc.Verdict != wire.VerdictDuplicate:
			refusal = cmp.Or(refusal, fmt.Errorf("%s version %d: %s/%s", rc.Task, rc.Version, rc.Verdict, rc.Reason))
		}
		if lat != nil {
			lat.add(time.Duration(at.UnixNano() - waiting[rc.EventID]))
		}
		delete(waiting, rc.EventID)
		received++
		times.received(at)
		if received == total || refusal != nil {
			select {
			case <-done:
			default:
				close(done)
			}
		}
	})
	if err != nil {
		return runTimes{}, fmt.Errorf("subscribe to receipts: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1) // a burst of receipts must never be dropped
	if err := p.nc.Flush(); err != nil {
		return runTimes{}, err
	}
	// The events are made as they go, round robin over the tasks, as a
	// worker would make them; counts differ by at most one, as the
	// source's round robin does.
	times.published(time.Now())
	send := func(int) error {
		m := p.src.next(1)[0]
		mu.Lock()
		waiting[wire.EventIDOf(m.Header.Get(wire.HeaderMsgID))] = time.Now().UnixNano()
		mu.Unlock()
		if _, err := p.js.PublishMsgAsync(m, jetstream.WithStallWait(ReceiptTimeout)); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		return nil
	}
	if rate > 0 {
		if _, err := pace(ctx, rate, total, send); err != nil {
			return runTimes{}, err
		}
	} else {
		for i := range total {
			if err := send(i); err != nil {
				return runTimes{}, err
			}
		}
	}
	if err := awaitAcks(ctx, p.js); err != nil {
		return runTimes{}, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return runTimes{}, ctx.Err()
	case <-time.After(ReceiptTimeout):
		mu.Lock()
		n := received
		mu.Unlock()
		return runTimes{}, fmt.Errorf("%d of %d events got no receipt within %v of their publish acks", total-n, total, ReceiptTimeout)
	}
	mu.Lock()
	defer mu.Unlock()
	if refusal != nil {
		return runTimes{}, refusal
	}
	rt := times.times()
	rt.lat = lat
	return rt, nil
}

func (p *rawPublisher) close() {
	if p.renew != nil {
		p.renew()
		<-p.renewd
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for part, gen := range p.gens {
		var rep wire.ReleaseReply
		_ = p.request(ctx, wire.LeaseRelease, wire.LeaseRequest{Partition: &part, Generation: &gen}, &rep)
	}
	p.nc.Close()
}
