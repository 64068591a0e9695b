package projection

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A gap is timed on the engine's clock from when it was first seen; it is
// reported for re-fetch only after the timeout, not again until another
// timeout, and the re-fetched version closes it.
func TestGapIsTimedReportedAndFilled(t *testing.T) {
	t.Parallel()
	e, clock := loaded(t, Config{GapTimeout: 5 * time.Second}, "t")
	offer(t, e, ev("t", 1, "started", `{"a":1}`), OutcomeApplied)

	clock.Advance(time.Second)
	opened := clock.Now()
	res := offer(t, e, ev("t", 4, "running", `{"d":4}`), OutcomeBuffered)
	require.Equal(t, &GapInfo{NextVersion: 2, Buffered: 1, Since: opened}, res.State.Gap)
	require.Equal(t, opened, res.State.UpdatedAt)

	clock.Advance(time.Second)
	res = offer(t, e, ev("t", 3, "running", `{"c":3}`), OutcomeBuffered)
	require.Equal(t, &GapInfo{NextVersion: 2, Buffered: 2, Since: opened}, res.State.Gap, "since is when the gap was first seen")
	require.Equal(t, 1, e.Stats().Waiting)

	clock.Advance(4*time.Second - time.Millisecond)
	require.Empty(t, e.DueRefetches(), "not due before the timeout")

	clock.Advance(time.Millisecond)
	require.Equal(t, []Refetch{{Task: "t", Partition: 3, FromVersion: 2, ToVersion: 2}}, e.DueRefetches())
	require.Empty(t, e.DueRefetches(), "reported once per timeout")
	clock.Advance(5*time.Second - time.Millisecond)
	require.Empty(t, e.DueRefetches())
	clock.Advance(time.Millisecond)
	require.Len(t, e.DueRefetches(), 1, "still missing after another timeout: asked again")

	st, _ := e.State("t")
	require.Equal(t, 2, st.Gap.Buffered, "the buffer is kept while waiting")

	res = offer(t, e, ev("t", 2, "running", `{"b":2}`), OutcomeApplied)
	require.Equal(t, 3, res.Applied)
	require.Equal(t, int64(4), res.State.Version)
	require.Equal(t, int64(1004), res.State.Seq)
	require.JSONEq(t, `{"a":1,"b":2,"c":3,"d":4}`, string(res.State.Data))
	require.Nil(t, res.State.Gap)
	require.Equal(t, Stats{Tasks: 1}, e.Stats())

	clock.Advance(time.Hour)
	require.Empty(t, e.DueRefetches())
}

// Progress restarts the clock: the task now waits at another version, and
// the versions in flight are evidently arriving.
func TestGapProgressRestartsTheClock(t *testing.T) {
	t.Parallel()
	e, clock := loaded(t, Config{}, "t")
	offer(t, e, ev("t", 2, "x", `{}`), OutcomeBuffered)
	offer(t, e, ev("t", 4, "x", `{}`), OutcomeBuffered)

	clock.Advance(4 * time.Second)
	res := offer(t, e, ev("t", 1, "x", `{}`), OutcomeApplied)
	require.Equal(t, &GapInfo{NextVersion: 3, Buffered: 1, Since: clock.Now()}, res.State.Gap)

	clock.Advance(4 * time.Second)
	require.Empty(t, e.DueRefetches(), "8s since the first gap, 4s at version 3")
	clock.Advance(time.Second)
	require.Equal(t, []Refetch{{Task: "t", Partition: 3, FromVersion: 3, ToVersion: 3}}, e.DueRefetches())
}

// The re-fetch range stops below the lowest buffered version, and the owner
// may offer the range with repeats and in any number of passes.
func TestRefetchRangeAndIdempotentReoffer(t *testing.T) {
	t.Parallel()
	e, clock := loaded(t, Config{}, "a", "b")
	offer(t, e, ev("b", 7, "x", `{"v":7}`), OutcomeBuffered)
	offer(t, e, ev("b", 4, "x", `{"v":4}`), OutcomeBuffered)
	offer(t, e, ev("a", 3, "x", `{"v":3}`), OutcomeBuffered)
	clock.Advance(GapTimeoutDefault)
	require.Equal(t, []Refetch{
		{Task: "a", Partition: 3, FromVersion: 1, ToVersion: 2},
		{Task: "b", Partition: 3, FromVersion: 1, ToVersion: 3},
	}, e.DueRefetches())

	for pass := 0; pass < 2; pass++ {
		for v := int64(1); v <= 3; v++ {
			_, err := e.Offer(ev("b", v, "x", `{"v":`+string(rune('0'+v))+`}`))
			require.NoError(t, err)
		}
	}
	st, _ := e.State("b")
	require.Equal(t, int64(4), st.Version)
	require.Equal(t, &GapInfo{NextVersion: 5, Buffered: 1, Since: clock.Now()}, st.Gap)
}
