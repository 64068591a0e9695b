package benchreport

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A phase's stage histogram is the scrape after it less the scrape before
// it; phases add up; a percentile's bound is the upper bound of the bucket
// that holds it, and one past the last bucket says so.
func TestStageHistogramsOfAPhase(t *testing.T) {
	t.Parallel()
	bounds := []float64{0.001, 0.002, 0.004, 0.008}
	before := stageHist{count: 10, sum: 0.01, bounds: bounds, cum: []uint64{10, 10, 10, 10}}
	after := stageHist{count: 110, sum: 0.31, bounds: bounds, cum: []uint64{10, 60, 109, 109}}
	phase := after.since(before)
	require.Equal(t, stageHist{count: 100, sum: 0.30, bounds: bounds, cum: []uint64{0, 50, 99, 99}}, roundSum(phase))
	require.Equal(t, 2*time.Millisecond, phase.atMost(0.5), "the 50th of 100 is in the second bucket")
	require.Equal(t, 4*time.Millisecond, phase.atMost(0.99))
	require.Equal(t, time.Duration(math.MaxInt64), phase.atMost(0.999), "the 100th is past the last bucket")
	require.Equal(t, "beyond the buckets", formatBound(phase.atMost(1)))

	two := stageHist{}.plus(phase).plus(phase)
	require.EqualValues(t, 200, two.count)
	require.Equal(t, []uint64{0, 100, 198, 198}, two.cum)
	require.Equal(t, []uint64{0, 50, 99, 99}, phase.cum, "adding left the phase as it was")

	rows := stageRows(map[string]stageHist{"receipt": phase, "delivery": phase, "queue": {}})
	require.Len(t, rows, 2, "a stage that counted nothing has no row")
	require.Equal(t, "delivery", rows[0].Stage, "in the order the ingest passes through them")
	require.Equal(t, "receipt", rows[1].Stage)
	require.Equal(t, 3*time.Millisecond, rows[0].Mean.Round(time.Microsecond))
}

func roundSum(h stageHist) stageHist {
	h.sum = math.Round(h.sum*1e9) / 1e9
	return h
}
