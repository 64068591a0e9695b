package benchreport

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// pace calls publish n times at rate a second, in 1 ms ticks (each tick
// publishes what is due by then), and returns how long it took.
func pace(ctx context.Context, rate float64, n int, publish func(i int) error) (time.Duration, error) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for i := 0; i < n; {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
		due := min(int(time.Since(start).Seconds()*rate), n)
		for ; i < due; i++ {
			if err := publish(i); err != nil {
				return 0, fmt.Errorf("publish: %w", err)
			}
		}
	}
	return time.Since(start), nil
}

// latencyTimer times events by id from their publish to their arrival
// (a receipt, a commit), for the paths that have no per-task tracker.
type latencyTimer struct {
	n int

	mu      sync.Mutex
	pub     map[string]int64 // event id → publish time, until it arrives
	lat     []time.Duration
	refused int
	first   string // the first refusal, in words
}

func newLatencyTimer(n int) *latencyTimer {
	return &latencyTimer{n: n, pub: make(map[string]int64, n), lat: make([]time.Duration, 0, n)}
}

// sent records that the event id is being published now.
func (t *latencyTimer) sent(id string) {
	now := time.Now().UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pub[id] = now
}

// arrived records that the events ids arrived at; an id that is not
// awaited (a repeat, another run's) is ignored.
func (t *latencyTimer) arrived(at int64, ids ...string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		if t0, ok := t.pub[id]; ok {
			t.lat = append(t.lat, time.Duration(at-t0))
			delete(t.pub, id)
		}
	}
}

// refuse records an event that arrived refused: the run fails.
func (t *latencyTimer) refuse(why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refused == 0 {
		t.first = why
	}
	t.refused++
}

// count is how many events arrived so far.
func (t *latencyTimer) count() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(len(t.lat))
}

// wait returns once all n events arrived; it fails on a refusal or at
// deadline.
func (t *latencyTimer) wait(ctx context.Context, deadline time.Time) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		t.mu.Lock()
		got, refused, first := len(t.lat), t.refused, t.first
		t.mu.Unlock()
		switch {
		case refused > 0:
			return fmt.Errorf("%d events refused, the first %s", refused, first)
		case got == t.n:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("%s of %s events did not arrive within %v after the last publish",
				group(int64(t.n-got)), group(int64(t.n)), ReceiptTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// latencies returns the times measured.
func (t *latencyTimer) latencies() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]time.Duration(nil), t.lat...)
}

// halves splits a latency path's n events into two rounds, so that two
// paths measured in turn alternate: a drift of the shared machine then
// weighs on both.
func halves(n int) []int {
	if n < 2 {
		return []int{n}
	}
	return []int{n / 2, n - n/2}
}
