package benchreport

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPipelinesAlternateRoundByRound(t *testing.T) {
	t.Parallel()
	var order []string
	step := func(name string, rate float64) measureFn {
		return func(_ context.Context, i int) (float64, time.Duration, error) {
			order = append(order, name)
			return rate + float64(i), time.Microsecond, nil
		}
	}
	var said []int
	rounds, err := alternate(context.Background(), 3, step("full", 10), step("bare", 20), func(i int, _ Round) { said = append(said, i) })
	require.NoError(t, err)
	require.Equal(t, []string{"full", "bare", "full", "bare", "full", "bare"}, order)
	require.Equal(t, []int{0, 1, 2}, said)
	require.Equal(t, Round{Full: 12, Bare: 22, FullCPU: time.Microsecond, BareCPU: time.Microsecond}, rounds[2])
}

func TestRatioIsTheMedianOfThePerRoundRatios(t *testing.T) {
	t.Parallel()
	// The machine drifts: round 2 is slow for both pipelines. The ratio of
	// the medians (30/30 = 1.00) would mix rounds; the median of the
	// per-round ratios (0.50, 0.50, 2.00) does not.
	rounds := []Round{
		{Full: 30, Bare: 60, FullCPU: 80 * time.Microsecond, BareCPU: 60 * time.Microsecond},
		{Full: 10, Bare: 20, FullCPU: 90 * time.Microsecond, BareCPU: 50 * time.Microsecond},
		{Full: 60, Bare: 30, FullCPU: 70 * time.Microsecond, BareCPU: 55 * time.Microsecond},
	}
	s := summarize(rounds)
	require.InDelta(t, 30, s.full, 1e-9)
	require.InDelta(t, 30, s.bare, 1e-9)
	require.InDelta(t, 0.5, s.ratio, 1e-9)
	require.Equal(t, 80*time.Microsecond, s.fullCPU)
	require.Equal(t, 55*time.Microsecond, s.bareCPU)
	require.InDelta(t, 2.5, median([]float64{4, 1, 2, 3}), 1e-9, "an even count takes the mean of the middle two")
}

func TestFirstSecondIsComparedWithTheRest(t *testing.T) {
	t.Parallel()
	start := time.Unix(100, 0)
	at := func(d time.Duration) int64 { return start.Add(d).UnixNano() }
	// 100 events in the first second, 600 in the next three.
	var arrivals []int64
	for i := range 100 {
		arrivals = append(arrivals, at(time.Duration(i)*10*time.Millisecond))
	}
	for i := range 600 {
		arrivals = append(arrivals, at(time.Second+time.Duration(i+1)*5*time.Millisecond))
	}
	first, rest := firstAndRest(start, arrivals, time.Second)
	require.Equal(t, 100, first.Events)
	require.InDelta(t, 100, first.PerSecond, 1e-9)
	require.Equal(t, 600, rest.Events)
	require.InDelta(t, 200, rest.PerSecond, 1e-9)
	require.InDelta(t, 0.5, first.Relative, 1e-9)
	require.Contains(t, first.Label, "first second")

	// A run shorter than two windows compares its two halves.
	first, rest = firstAndRest(start, []int64{at(100 * time.Millisecond), at(300 * time.Millisecond), at(400 * time.Millisecond)}, time.Second)
	require.Equal(t, 1, first.Events)
	require.Equal(t, 2, rest.Events)
	require.Equal(t, 200*time.Millisecond, first.Elapsed)
	require.Contains(t, first.Label, "first 200 ms")
}

func TestParseSections(t *testing.T) {
	t.Parallel()
	for spec, want := range map[string][]Section{
		"":                      Sections,
		"all":                   Sections,
		"pipeline,latency":      {SectionPipeline, SectionLatency},
		"projector,baselines":   {SectionBaselines, SectionProjector},
		" sdk , projector,sdk ": {SectionSDK, SectionProjector},
		"baselines":             {SectionBaselines},
	} {
		got, err := ParseSections(spec)
		require.NoError(t, err, spec)
		require.Equal(t, want, got, spec)
	}
	for _, spec := range []string{"pipelines", "pipeline,", ",", "all,sdk"} {
		_, err := ParseSections(spec)
		require.ErrorContains(t, err, "no section", spec)
	}
}

func TestHalfRate(t *testing.T) {
	t.Parallel()
	require.Equal(t, 12_345, halfRate(24_690.9, time.Second))
	require.Equal(t, 10, halfRate(1, 100*time.Millisecond), "at least one event in the duration")
}
