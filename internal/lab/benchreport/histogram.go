package benchreport

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// A latency histogram of an external latency run. Each worker process
// counts its events' latencies in buckets 1% wide and sends the non-empty
// ones on its done line; the coordinator adds them up, so that percentiles
// are over every event of every process, to within 1%.

const (
	// histLowest is the upper bound of bucket 0: latencies below it count
	// there.
	histLowest = 10 * time.Microsecond
	// histGrowth is each bucket's upper bound over the one before.
	histGrowth = 1.01
	// histBuckets reaches beyond 100 s (10 µs · 1.01^1621 ≈ 100 s); longer
	// latencies count in the last bucket.
	histBuckets = 1622
)

// bucketOf is the bucket a latency counts in.
func bucketOf(d time.Duration) int {
	if d <= histLowest {
		return 0
	}
	k := int(math.Ceil(math.Log(float64(d)/float64(histLowest)) / math.Log(histGrowth)))
	return min(max(k, 0), histBuckets-1)
}

// bucketTop is the upper bound of bucket k: what a percentile falling in
// it reports, at most 1% above the latencies counted there.
func bucketTop(k int) time.Duration {
	return time.Duration(float64(histLowest) * math.Pow(histGrowth, float64(k)))
}

// histogram counts latencies by bucket; safe for concurrent use.
type histogram struct {
	mu     sync.Mutex
	counts map[int]int64
}

func (h *histogram) add(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counts == nil {
		h.counts = map[int]int64{}
	}
	h.counts[bucketOf(d)]++
}

// buckets are the non-empty buckets as [bucket, count] pairs, in bucket
// order: the form a done line carries.
func (h *histogram) buckets() [][]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([][]int64, 0, len(h.counts))
	for k, n := range h.counts {
		out = append(out, []int64{int64(k), n})
	}
	slices.SortFunc(out, func(a, b []int64) int { return int(a[0] - b[0]) })
	return out
}

// checkBuckets refuses pairs a histogram does not write: anything but
// pairs, buckets out of range or out of order, counts below 1, or a total
// other than events.
func checkBuckets(b [][]int64, events int) error {
	var total int64
	for i, kv := range b {
		if len(kv) != 2 {
			return fmt.Errorf("a latency bucket of %d numbers", len(kv))
		}
		switch {
		case kv[0] < 0 || kv[0] >= histBuckets:
			return fmt.Errorf("latency bucket %d is outside 0..%d", kv[0], histBuckets-1)
		case i > 0 && kv[0] <= b[i-1][0]:
			return errors.New("latency buckets out of order")
		case kv[1] < 1 || kv[1] > math.MaxInt32:
			return fmt.Errorf("latency bucket %d counts %d", kv[0], kv[1])
		}
		total += kv[1]
	}
	if total != int64(events) {
		return fmt.Errorf("latency buckets count %d events, not %d", total, events)
	}
	return nil
}

// latencies is a merged histogram.
type latencies map[int]int64

func (l latencies) merge(b [][]int64) {
	for _, kv := range b {
		l[int(kv[0])] += kv[1]
	}
}

func (l latencies) count() int64 {
	var n int64
	for _, c := range l {
		n += c
	}
	return n
}

// percentile is the nearest-rank percentile p, as its bucket's upper
// bound; 0 when empty.
func (l latencies) percentile(p int) time.Duration {
	n := l.count()
	if n == 0 {
		return 0
	}
	rank := max((n*int64(p)+99)/100, 1) // ceil(n·p/100)
	keys := make([]int, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var seen int64
	for _, k := range keys {
		if seen += l[k]; seen >= rank {
			return bucketTop(k)
		}
	}
	return bucketTop(keys[len(keys)-1])
}
