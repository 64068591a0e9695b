package projection

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// payloadFor is the true payload of a version in these tests.
func payloadFor(v int64) string { return fmt.Sprintf(`{"v%d":%d}`, v%3, v) }

// catchUp answers a refetch like the projector: every version from
// FromVersion through the last one committed, in order.
func catchUp(t *testing.T, e *Engine, r Refetch, committed int64) {
	t.Helper()
	to := r.ToVersion
	if r.CatchUp {
		to = committed
	}
	for v := r.FromVersion; v <= to; v++ {
		_, err := e.Offer(ev(r.Task, v, "step", payloadFor(v)))
		require.NoError(t, err)
	}
}

// foldTo is the expected data after versions 1..n of payloadFor.
func foldTo(t *testing.T, n int64) string {
	var data []byte
	for v := int64(1); v <= n; v++ {
		out, err := MergePatch(data, []byte(payloadFor(v)))
		require.NoError(t, err)
		data = out
	}
	return dataString(data)
}

func TestPerTaskOverflowTurnsIntoCatchUp(t *testing.T) {
	t.Parallel()
	e, clock := loaded(t, Config{MaxBufferedPerTask: 3, MaxBuffered: 100}, "t")
	for v := int64(3); v <= 5; v++ {
		offer(t, e, ev("t", v, "step", payloadFor(v)), OutcomeBuffered)
	}
	res := offer(t, e, ev("t", 6, "step", payloadFor(6)), OutcomeDeferred)
	require.True(t, res.Changed)
	require.Equal(t, 0, res.State.Gap.Buffered, "the buffer is dropped, not kept half full")
	require.Equal(t, int64(1), res.State.Gap.NextVersion)
	require.Equal(t, 0, e.Stats().Buffered)

	due := e.DueRefetches()
	require.Equal(t, []Refetch{{Task: "t", Partition: 3, FromVersion: 1, ToVersion: 0, CatchUp: true}}, due, "due at once")

	res = offer(t, e, ev("t", 8, "step", payloadFor(8)), OutcomeDeferred)
	require.False(t, res.Changed)
	require.Empty(t, e.DueRefetches(), "more drops are covered by the request already made")

	// The read started before version 8 was committed: it ends at 7.
	catchUp(t, e, due[0], 7)
	st, _ := e.State("t")
	require.Equal(t, int64(7), st.Version)
	require.NotNil(t, st.Gap, "version 8 was dropped, so the catch-up goes on")
	offer(t, e, ev("t", 9, "step", payloadFor(9)), OutcomeDeferred)

	clock.Advance(GapTimeoutDefault)
	due = e.DueRefetches()
	require.Equal(t, []Refetch{{Task: "t", Partition: 3, FromVersion: 8, CatchUp: true}}, due)
	catchUp(t, e, due[0], 9)

	st, _ = e.State("t")
	require.Equal(t, int64(9), st.Version)
	require.Nil(t, st.Gap)
	require.JSONEq(t, foldTo(t, 9), string(st.Data))

	offer(t, e, ev("t", 11, "step", payloadFor(11)), OutcomeBuffered)
}

func TestTotalOverflowStopsTheTaskThatDoesNotFit(t *testing.T) {
	t.Parallel()
	e, _ := loaded(t, Config{MaxBufferedPerTask: 4, MaxBuffered: 4}, "a", "b")
	for v := int64(2); v <= 4; v++ {
		offer(t, e, ev("a", v, "step", payloadFor(v)), OutcomeBuffered)
	}
	offer(t, e, ev("b", 2, "step", payloadFor(2)), OutcomeBuffered)
	require.Equal(t, 4, e.Stats().Buffered)

	offer(t, e, ev("b", 3, "step", payloadFor(3)), OutcomeDeferred)
	require.Equal(t, 3, e.Stats().Buffered, "b's buffer went, a's stays")

	due := e.DueRefetches()
	require.Equal(t, []Refetch{{Task: "b", Partition: 3, FromVersion: 1, CatchUp: true}}, due)
	catchUp(t, e, due[0], 3)
	res := offer(t, e, ev("a", 1, "step", payloadFor(1)), OutcomeApplied)
	require.Equal(t, 4, res.Applied)

	for _, id := range []string{"a", "b"} {
		st, _ := e.State(id)
		require.Nil(t, st.Gap, id)
	}
	st, _ := e.State("b")
	require.JSONEq(t, foldTo(t, 3), string(st.Data))
	require.Equal(t, Stats{Tasks: 2}, e.Stats())
}

func TestBufferedBytesAreCapped(t *testing.T) {
	t.Parallel()
	big := `{"blob":"` + strings.Repeat("x", 100) + `"}`
	e, _ := loaded(t, Config{MaxBufferedBytes: 250}, "t")
	offer(t, e, ev("t", 2, "step", big), OutcomeBuffered)
	offer(t, e, ev("t", 3, "step", big), OutcomeBuffered)
	require.Equal(t, 2*len(big), e.Stats().BufferedBytes)
	offer(t, e, ev("t", 4, "step", big), OutcomeDeferred)
	require.Equal(t, Stats{Tasks: 1, Waiting: 1}, e.Stats())
}
