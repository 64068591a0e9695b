package benchreport

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// sample is one event's timeline, in wall-clock Unix nanoseconds (the
// bucket's times come from the NATS server's clock, on this same host);
// zero until it happened. Each field has one writer: the publisher, the
// ack waiter, the receipt subscription, the bucket watcher.
type sample struct {
	pub, ack, receipt, kv int64
}

// tracker follows one pipeline phase's events by task and version, as
// receipts and bucket values name them.
type tracker struct {
	load    *load
	base    []int64    // per task: versions published before the phase
	samples [][]sample // [task][version-base-1]
	total   int

	kvSeen []int64 // per task: highest version the bucket showed; the watcher's only

	receipts, kvs atomic.Int64
	refused       atomic.Int64
	firstRefusal  atomic.Pointer[wire.Receipt]
}

// newTracker follows counts[t] events of each task t, versions base[t]+1
// onwards.
func newTracker(l *load, base []int64, counts []int) *tracker {
	t := &tracker{load: l, base: base, samples: make([][]sample, len(counts)), kvSeen: make([]int64, len(counts))}
	for i, n := range counts {
		t.samples[i] = make([]sample, n)
		t.kvSeen[i] = base[i]
		t.total += n
	}
	return t
}

// sample returns task's sample of version, nil if the phase has none.
func (t *tracker) sample(task int, version int64) *sample {
	i := version - t.base[task] - 1
	if i < 0 || i >= int64(len(t.samples[task])) {
		return nil
	}
	return &t.samples[task][i]
}

// onReceipt records a receipt that arrived at; a repeated receipt counts
// once.
func (t *tracker) onReceipt(rc wire.Receipt, at int64) {
	i, ok := t.load.index[rc.Task]
	if !ok {
		return
	}
	s := t.sample(i, rc.Version)
	if s == nil || s.receipt != 0 {
		return
	}
	if rc.Verdict != wire.VerdictCommitted && rc.Verdict != wire.VerdictDuplicate {
		t.firstRefusal.CompareAndSwap(nil, &rc)
		t.refused.Add(1)
	}
	s.receipt = at
	t.receipts.Add(1)
}

// onValue records that the bucket showed task at version at: every
// version up to it reached the bucket then, if not earlier.
func (t *tracker) onValue(task string, version int64, at int64) {
	i, ok := t.load.index[task]
	if !ok {
		return
	}
	hi := min(version, t.base[i]+int64(len(t.samples[i])))
	for v := t.kvSeen[i] + 1; v <= hi; v++ {
		t.samples[i][v-t.base[i]-1].kv = at
		t.kvs.Add(1)
	}
	t.kvSeen[i] = max(t.kvSeen[i], hi)
}

// wait returns once every event has its receipt and reached the bucket.
// It fails on a refused event, after stall (if positive) without any
// progress, or at deadline (if not zero).
func (t *tracker) wait(ctx context.Context, stall time.Duration, deadline time.Time) error {
	total := int64(t.total)
	var last int64 = -1
	since := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if rc := t.firstRefusal.Load(); rc != nil {
			return fmt.Errorf("%d events refused, the first %s version %d: %s/%s",
				t.refused.Load(), rc.Task, rc.Version, rc.Verdict, rc.Reason)
		}
		receipts, kvs := t.receipts.Load(), t.kvs.Load()
		if receipts == total && kvs == total {
			return nil
		}
		if receipts+kvs != last {
			last, since = receipts+kvs, time.Now()
		}
		switch {
		case stall > 0 && time.Since(since) > stall:
			return t.missing(fmt.Sprintf("after %v without progress", stall))
		case !deadline.IsZero() && time.Now().After(deadline):
			return t.missing(fmt.Sprintf("within %v after the last publish", ReceiptTimeout))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (t *tracker) missing(when string) error {
	receipts, kvs := t.receipts.Load(), t.kvs.Load()
	if receipts < int64(t.total) {
		return fmt.Errorf("%s of %s events got no receipt %s", group(int64(t.total)-receipts), group(int64(t.total)), when)
	}
	return fmt.Errorf("%s of %s events never reached the bucket %s", group(int64(t.total)-kvs), group(int64(t.total)), when)
}

// last returns the latest receipt and bucket times of the phase.
func (t *tracker) last() (receipt, kv int64) {
	for _, ss := range t.samples {
		for _, s := range ss {
			receipt, kv = max(receipt, s.receipt), max(kv, s.kv)
		}
	}
	return receipt, kv
}

// arrivals returns the time field picks of every event that has it.
func (t *tracker) arrivals(field func(*sample) int64) []int64 {
	out := make([]int64, 0, t.total)
	for _, ss := range t.samples {
		for k := range ss {
			if at := field(&ss[k]); at != 0 {
				out = append(out, at)
			}
		}
	}
	return out
}

// latencies returns, over every event that has both times, the time from
// its publish to the one that field picks.
func (t *tracker) latencies(field func(*sample) int64) []time.Duration {
	out := make([]time.Duration, 0, t.total)
	for _, ss := range t.samples {
		for k := range ss {
			s := &ss[k]
			if at := field(s); at != 0 && s.pub != 0 {
				out = append(out, time.Duration(at-s.pub))
			}
		}
	}
	return out
}

// spread divides n events over tasks, round robin: the first n mod tasks
// get one more.
func spread(n, tasks int) []int {
	out := make([]int, tasks)
	for t := range out {
		out[t] = n / tasks
		if t < n%tasks {
			out[t]++
		}
	}
	return out
}
