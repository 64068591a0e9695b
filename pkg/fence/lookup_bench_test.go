package fence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
)

// BenchmarkVerdictLookups measures 1000 verdict lookups with content, as
// the lease service answers them: one at a time (a head and a verdict per
// lookup, as the single form does) and in one VerdictsFor call, on one
// store, turn by turn, so both see the same machine. Half the ids are
// committed (50 tasks of 10 versions), half
// never published. It reports the time of each per 1000
// lookups and the batch's ratio to the single lookups.
func BenchmarkVerdictLookups(b *testing.B) {
	const n = 1000
	s, _ := newStore(b, fence.Config{})
	ctx := context.Background()
	l, err := s.Acquire(ctx, 1, "worker-a.1", longTTL)
	require.NoError(b, err)
	lookups := make([]fence.Lookup, n)
	var batch []fence.Event
	for i := range n {
		task := fmt.Sprintf("bench-%d", i%100)
		e := ev(l, task, int64(i/100+1), "step")
		lookups[i] = fence.Lookup{Task: task, EventID: e.ID,
			Content: &fence.Content{Version: e.Version, Type: e.Type, Payload: e.Payload}}
		if i%2 == 0 {
			batch = append(batch, e)
		} else {
			lookups[i].EventID = newID()
		}
	}
	// Even i are the even tasks' versions 1..10, in order: all commit.
	for _, e := range batch {
		require.Equal(b, "committed", string(appendOne(b, s, e).Verdict))
	}
	var single, batched time.Duration
	for b.Loop() {
		start := time.Now()
		for _, lk := range lookups {
			_, err := s.TaskHead(ctx, lk.Task)
			require.NoError(b, err)
			_, _, err = s.VerdictFor(ctx, lk.Task, lk.EventID, lk.Content)
			require.NoError(b, err)
		}
		single += time.Since(start)
		start = time.Now()
		out, err := s.VerdictsFor(ctx, lookups)
		require.NoError(b, err)
		require.Len(b, out, n)
		batched += time.Since(start)
	}
	b.ReportMetric(float64(single.Microseconds())/float64(b.N)/1000, "single_ms/1000")
	b.ReportMetric(float64(batched.Microseconds())/float64(b.N)/1000, "batch_ms/1000")
	b.ReportMetric(float64(batched)/float64(single), "batch/single")
}
