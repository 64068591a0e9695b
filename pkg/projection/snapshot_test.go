package projection

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func snapEv(task string, version int64, payload string) Event {
	e := ev(task, version, "state", payload)
	e.Snapshot = true
	return e
}

// A snapshot task's projection is its newest snapshot: a later version
// applies at once, whatever it skips, and replaces the data (no merge);
// nothing waits, no gap is reported and nothing is re-fetched; an older
// snapshot arriving late changes nothing.
func TestSnapshotTaskShowsTheNewestSnapshot(t *testing.T) {
	t.Parallel()
	e, clock := loaded(t, Config{}, "gauge-1")

	res := offer(t, e, snapEv("gauge-1", 3, `{"a":1,"b":2}`), OutcomeApplied)
	require.EqualValues(t, 3, res.State.Version)
	require.Equal(t, KindSnapshot, res.State.Kind)
	require.Nil(t, res.State.Gap)

	res = offer(t, e, snapEv("gauge-1", 7, `{"a":5,"c":null}`), OutcomeApplied)
	require.EqualValues(t, 7, res.State.Version, "version 7 does not wait for 4..6")
	require.JSONEq(t, `{"a":5,"c":null}`, dataString(res.State.Data), "the snapshot replaces the data")
	require.Nil(t, res.State.Gap)

	res = offer(t, e, snapEv("gauge-1", 5, `{"a":3}`), OutcomeUnverified)
	require.False(t, res.Changed, "an older snapshot arriving late is ignored")
	require.EqualValues(t, 7, res.State.Version)
	require.JSONEq(t, `{"a":5,"c":null}`, dataString(res.State.Data))

	offer(t, e, snapEv("gauge-1", 7, `{"a":5,"c":null}`), OutcomeDuplicate)
	clock.Advance(time.Hour)
	require.Empty(t, e.DueRefetches(), "nothing is re-fetched for the skipped versions")
	require.Zero(t, e.Stats().Waiting)
	require.Zero(t, e.Stats().Buffered)
}

// A projection stored as a snapshot task's keeps its kind when loaded, so
// a later snapshot applies at once even from a copy that does not say it.
func TestLoadedSnapshotTaskKeepsItsKind(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, Config{})
	require.NoError(t, e.Load(State{Task: "gauge-1", Version: 4, Status: "state", Data: []byte(`{"a":1}`), Kind: KindSnapshot}))
	res := offer(t, e, ev("gauge-1", 9, "state", `{"a":2}`), OutcomeApplied)
	require.EqualValues(t, 9, res.State.Version)
	require.JSONEq(t, `{"a":2}`, dataString(res.State.Data))
}
