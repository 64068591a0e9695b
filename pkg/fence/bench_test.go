package fence_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// BenchmarkAppend measures Append on one connection's worth of calls, with
// every check in place: 16 partitions, ~200-byte JSON payloads, 1000 tasks
// advancing one version per event. It reports events/s.
func BenchmarkAppend(b *testing.B) {
	for _, size := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			s, _ := newStore(b, fence.Config{})
			ctx := context.Background()
			const partitions, tasks = 16, 1000
			leases := make([]fence.Lease, partitions)
			for p := range partitions {
				l, err := s.Acquire(ctx, p, fmt.Sprintf("bench-%d", p), fence.TTLMax)
				require.NoError(b, err)
				leases[p] = l
			}
			versions := make([]int64, tasks)
			filler := strings.Repeat("x", 150)
			next := 0
			batch := make([]fence.Event, size)
			b.ResetTimer()
			var spent time.Duration // in Append only, not in building the batch
			for range b.N {
				for i := range batch {
					task := next % tasks
					next++
					versions[task]++
					l := leases[task%partitions]
					batch[i] = fence.Event{
						ID: newID(), Partition: l.Partition, Task: fmt.Sprintf("task-%d", task),
						Version: versions[task], Type: "progress",
						Payload: []byte(fmt.Sprintf(`{"step":%d,"note":%q}`, versions[task], filler)),
						Holder:  l.Holder, Generation: l.Generation,
					}
				}
				start := time.Now()
				res, err := s.Append(ctx, batch)
				spent += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					if r.Verdict != wire.VerdictCommitted {
						b.Fatalf("verdict %s/%s", r.Verdict, r.Reason)
					}
				}
			}
			b.ReportMetric(float64(b.N*size)/spent.Seconds(), "events/s")
		})
	}
}
