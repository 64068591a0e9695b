package projection

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The seed scenario: an early version waits, the missing one releases both,
// a repeat is a duplicate and a rewrite is a conflict that is not applied.
func TestSeedScenarioOutOfOrderDuplicateConflict(t *testing.T) {
	t.Parallel()
	e, _ := loaded(t, Config{}, "report-7")
	steps := []struct {
		name        string
		event       Event
		wantOutcome Outcome
		wantApplied int
		wantVersion int64
		wantStatus  string
		wantData    string
		wantErr     error
	}{
		{
			name:        "version 2 first waits, the task is still new",
			event:       ev("report-7", 2, "completed", `{"result":"ok"}`),
			wantOutcome: OutcomeBuffered, wantVersion: 0, wantStatus: "", wantData: `null`,
		},
		{
			name:        "version 1 applies itself and the buffered version 2",
			event:       ev("report-7", 1, "running", `{"step":1}`),
			wantOutcome: OutcomeApplied, wantApplied: 2, wantVersion: 2, wantStatus: "completed",
			wantData: `{"step":1,"result":"ok"}`,
		},
		{
			name:        "version 2 again with the same content is a duplicate",
			event:       ev("report-7", 2, "completed", `{"result":"ok"}`),
			wantOutcome: OutcomeDuplicate, wantVersion: 2, wantStatus: "completed",
			wantData: `{"step":1,"result":"ok"}`,
		},
		{
			name:        "version 2 with other content is a conflict and is not applied",
			event:       ev("report-7", 2, "failed", `{"result":"boom"}`),
			wantOutcome: OutcomeConflict, wantVersion: 2, wantStatus: "completed",
			wantData: `{"step":1,"result":"ok"}`, wantErr: ErrConflict,
		},
	}
	for _, step := range steps {
		res, err := e.Offer(step.event)
		if step.wantErr != nil {
			require.ErrorIs(t, err, step.wantErr, step.name)
		} else {
			require.NoError(t, err, step.name)
		}
		require.Equal(t, step.wantOutcome, res.Outcome, step.name)
		require.Equal(t, step.wantApplied, res.Applied, step.name)
		require.Equal(t, step.wantVersion, res.State.Version, step.name)
		require.Equal(t, step.wantStatus, res.State.Status, step.name)
		require.JSONEq(t, step.wantData, dataString(res.State.Data), step.name)
	}
	st, ok := e.State("report-7")
	require.True(t, ok)
	require.Equal(t, int64(1002), st.Seq, "seq is the last applied event's")
	require.Nil(t, st.Gap)
}

func TestOutcomesAndChanged(t *testing.T) {
	t.Parallel()
	e, _ := loaded(t, Config{}, "a")
	cases := []struct {
		name        string
		event       Event
		wantOutcome Outcome
		wantChanged bool
	}{
		{"next version applies", ev("a", 1, "started", `{}`), OutcomeApplied, true},
		{"redelivery is a duplicate", ev("a", 1, "started", `{}`), OutcomeDuplicate, false},
		{"early version is buffered", ev("a", 3, "done", `{}`), OutcomeBuffered, true},
		{"buffered version again is a duplicate", ev("a", 3, "done", `{}`), OutcomeDuplicate, false},
		{"missing version releases the buffer", ev("a", 2, "running", `{}`), OutcomeApplied, true},
	}
	for _, c := range cases {
		res := offer(t, e, c.event, c.wantOutcome)
		require.Equal(t, c.wantChanged, res.Changed, c.name)
	}
}

// The same event re-fetched from a jsonb column is spelled differently from
// the published copy; it must still count as a duplicate.
func TestDuplicateComparesPayloadsAsJSON(t *testing.T) {
	t.Parallel()
	e, _ := loaded(t, Config{}, "t")
	offer(t, e, ev("t", 1, "running", `{"b":[1,2.50],"a":"\u00e9\/x","n":null}`), OutcomeApplied)
	offer(t, e, ev("t", 2, "done", ``), OutcomeApplied) // empty body is null

	cases := []struct {
		name  string
		event Event
		want  Outcome
	}{
		{"jsonb spelling", ev("t", 1, "running", `{"a": "é/x", "b": [1, 2.5], "n": null}`), OutcomeDuplicate},
		{"exponent spelling", ev("t", 1, "running", `{"n":null,"a":"é/x","b":[1e0,25E-1]}`), OutcomeDuplicate},
		{"explicit null for an empty body", ev("t", 2, "done", ` null `), OutcomeDuplicate},
		{"other type", ev("t", 1, "failed", `{"a":"é/x","b":[1,2.5],"n":null}`), OutcomeConflict},
		{"other number", ev("t", 1, "running", `{"a":"é/x","b":[1,2.51],"n":null}`), OutcomeConflict},
		{"other array order", ev("t", 1, "running", `{"a":"é/x","b":[2.5,1],"n":null}`), OutcomeConflict},
		{"missing member", ev("t", 1, "running", `{"a":"é/x","b":[1,2.5]}`), OutcomeConflict},
	}
	for _, c := range cases {
		res, err := e.Offer(c.event)
		require.Equal(t, c.want, res.Outcome, c.name)
		require.False(t, res.Changed, c.name)
		if c.want == OutcomeConflict {
			require.ErrorIs(t, err, ErrConflict, c.name)
		} else {
			require.NoError(t, err, c.name)
		}
	}
}

func TestConflictWithBufferedCopyKeepsTheFirst(t *testing.T) {
	t.Parallel()
	e, _ := loaded(t, Config{}, "t")
	offer(t, e, ev("t", 2, "done", `{"r":1}`), OutcomeBuffered)
	res, err := e.Offer(ev("t", 2, "done", `{"r":2}`))
	require.ErrorIs(t, err, ErrConflict)
	require.Equal(t, OutcomeConflict, res.Outcome)
	require.Equal(t, 1, res.State.Gap.Buffered)

	res = offer(t, e, ev("t", 1, "running", `{}`), OutcomeApplied)
	require.JSONEq(t, `{"r":1}`, string(res.State.Data), "the copy seen first is applied")
}

// Beyond the remembered window the engine cannot tell a duplicate from a
// conflict; it says so and changes nothing.
func TestOldVersionBeyondWindowIsUnverified(t *testing.T) {
	t.Parallel()
	e, _ := loaded(t, Config{DedupWindow: 2}, "t")
	for v := int64(1); v <= 10; v++ {
		offer(t, e, ev("t", v, "step", fmt.Sprintf(`{"v":%d}`, v)), OutcomeApplied)
	}
	res := offer(t, e, ev("t", 1, "step", `{"v":"rewritten"}`), OutcomeUnverified)
	require.False(t, res.Changed)
	require.Equal(t, int64(10), res.State.Version)
	require.JSONEq(t, `{"v":10}`, string(res.State.Data))

	offer(t, e, ev("t", 9, "step", `{"v":9}`), OutcomeDuplicate)
	_, err := e.Offer(ev("t", 9, "step", `{"v":"rewritten"}`))
	require.ErrorIs(t, err, ErrConflict, "versions inside the window are still judged")
}

func TestOfferNeedsTheTaskLoaded(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, Config{})
	_, err := e.Offer(ev("t", 1, "x", `{}`))
	require.ErrorIs(t, err, ErrNotLoaded)

	require.NoError(t, e.Load(State{Task: "t"}))
	offer(t, e, ev("t", 1, "x", `{}`), OutcomeApplied)
}

func TestLoadResumesFromStoredState(t *testing.T) {
	t.Parallel()
	e, clock := newEngine(t, Config{})
	stored := State{Task: "t", Partition: 3, Version: 5, Status: "running", Data: json.RawMessage(`{"a":1,"b":{"c":2}}`), Seq: 77,
		UpdatedAt: clock.Now().Add(-time.Hour)}
	require.NoError(t, e.Load(stored))

	st, ok := e.State("t")
	require.True(t, ok)
	require.Equal(t, stored, st)

	res := offer(t, e, ev("t", 3, "running", `{}`), OutcomeUnverified)
	require.False(t, res.Changed)
	res = offer(t, e, ev("t", 6, "completed", `{"b":{"d":3},"a":null}`), OutcomeApplied)
	require.Equal(t, int64(6), res.State.Version)
	require.Equal(t, "completed", res.State.Status)
	require.JSONEq(t, `{"b":{"c":2,"d":3}}`, string(res.State.Data))
	require.Equal(t, clock.Now(), res.State.UpdatedAt)

	require.NoError(t, e.Load(stored), "an older stored copy does not rewind a resident task")
	st, _ = e.State("t")
	require.Equal(t, int64(6), st.Version)
}

func TestLoadNewerStoredStateReplacesResident(t *testing.T) {
	t.Parallel()
	e, _ := loaded(t, Config{}, "t")
	offer(t, e, ev("t", 1, "a", `{}`), OutcomeApplied)
	offer(t, e, ev("t", 3, "c", `{}`), OutcomeBuffered)
	offer(t, e, ev("t", 9, "i", `{}`), OutcomeBuffered)

	require.NoError(t, e.Load(State{Task: "t", Version: 4, Status: "d"}))
	st, _ := e.State("t")
	require.Equal(t, int64(4), st.Version)
	require.Equal(t, &GapInfo{NextVersion: 5, Buffered: 0, Since: st.Gap.Since}, st.Gap,
		"version 9 was buffered beyond the new head, so it must be read again")
	require.Equal(t, []Refetch{{Task: "t", FromVersion: 5, CatchUp: true}}, e.DueRefetches())
	require.Equal(t, 0, e.Stats().Buffered)
}

// A stored gap means a crashed process held buffered events that are gone;
// only a catch-up read can bring them back.
func TestLoadWithStoredGapAsksForCatchUp(t *testing.T) {
	t.Parallel()
	e, clock := newEngine(t, Config{})
	since := clock.Now().Add(-time.Minute)
	require.NoError(t, e.Load(State{Task: "t", Partition: 2, Version: 4, Gap: &GapInfo{NextVersion: 5, Buffered: 2, Since: since}}))

	st, _ := e.State("t")
	require.Equal(t, &GapInfo{NextVersion: 5, Buffered: 0, Since: since}, st.Gap)
	require.Equal(t, []Refetch{{Task: "t", Partition: 2, FromVersion: 5, CatchUp: true}}, e.DueRefetches())

	for v := int64(5); v <= 7; v++ {
		offer(t, e, ev("t", v, "x", `{}`), OutcomeApplied)
	}
	st, _ = e.State("t")
	require.Nil(t, st.Gap, "the two lost versions were at most 7")
}

func TestInvalidInput(t *testing.T) {
	t.Parallel()
	e, _ := loaded(t, Config{}, "t")
	for _, bad := range []Event{
		{Version: 1},
		{Task: "t", Version: 0},
		{Task: "t", Version: -1},
	} {
		_, err := e.Offer(bad)
		require.ErrorIs(t, err, ErrInvalidEvent)
	}
	for _, bad := range []State{{}, {Task: "t", Version: -1}, {Task: "u", Data: json.RawMessage(`{"a":`)},
		{Task: "v", Version: 5, DataTooLarge: 2 << 20}} {
		require.ErrorIs(t, e.Load(bad), ErrInvalidState)
	}
}

// A copy of the next version with a broken payload cannot be applied and
// must not be skipped either: the database holds a good copy.
func TestDamagedNextVersionIsReadAgain(t *testing.T) {
	t.Parallel()
	e, _ := loaded(t, Config{}, "t")
	offer(t, e, ev("t", 2, "b", `{"b":2}`), OutcomeBuffered)

	res, err := e.Offer(ev("t", 1, "a", `{"a":`))
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.Equal(t, OutcomeRejected, res.Outcome)
	require.True(t, res.Changed)
	require.Equal(t, int64(0), res.State.Version)
	require.Equal(t, []Refetch{{Task: "t", Partition: 3, FromVersion: 1, CatchUp: true}}, e.DueRefetches())

	offer(t, e, ev("t", 1, "a", `{"a":1}`), OutcomeApplied)
	res = offer(t, e, ev("t", 2, "b", `{"b":2}`), OutcomeApplied)
	require.JSONEq(t, `{"a":1,"b":2}`, string(res.State.Data))
	require.Nil(t, res.State.Gap)
}

func TestReducerFailureIsRetriedNotSkipped(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	fail := true
	r := ReducerFunc(func(s State, ev Event) (State, error) {
		if ev.Version == 2 && fail {
			return s, errBoom
		}
		return MergeReducer{}.Reduce(s, ev)
	})
	e, clock := loaded(t, Config{Reducer: r}, "t")
	offer(t, e, ev("t", 1, "a", `{}`), OutcomeApplied)
	offer(t, e, ev("t", 3, "c", `{}`), OutcomeBuffered)

	res, err := e.Offer(ev("t", 2, "b", `{}`))
	require.ErrorIs(t, err, ErrReduce)
	require.ErrorIs(t, err, errBoom)
	require.Equal(t, OutcomeRejected, res.Outcome)
	require.Equal(t, int64(1), res.State.Version)
	require.NotNil(t, res.State.Gap)
	require.Empty(t, e.DueRefetches(), "a failing reducer is retried after the gap timeout, not in a loop")

	clock.Advance(GapTimeoutDefault)
	require.Equal(t, []Refetch{{Task: "t", Partition: 3, FromVersion: 2, CatchUp: true}}, e.DueRefetches())
	fail = false
	offer(t, e, ev("t", 2, "b", `{}`), OutcomeApplied)
	res = offer(t, e, ev("t", 3, "c", `{}`), OutcomeApplied)
	require.Equal(t, int64(3), res.State.Version)
	require.Nil(t, res.State.Gap)
}

func TestEvictAndTrimOnlyIdleTasks(t *testing.T) {
	t.Parallel()
	e, _ := loaded(t, Config{MaxTasks: 2}, "a", "b", "c", "d")
	offer(t, e, ev("a", 2, "x", `{}`), OutcomeBuffered) // a waits: never evicted
	offer(t, e, ev("c", 1, "x", `{}`), OutcomeApplied)  // c is the most recent
	offer(t, e, ev("b", 1, "x", `{}`), OutcomeApplied)  // b even more

	require.Equal(t, []string{"d", "c"}, e.Trim(), "d then c go; a waits and b is the newest")
	require.Equal(t, 2, e.Stats().Tasks)
	_, ok := e.State("d")
	require.False(t, ok)
	_, ok = e.State("c")
	require.False(t, ok)

	require.False(t, e.Evict("a"), "a waiting task keeps its buffer")
	require.True(t, e.Evict("b"))
	require.False(t, e.Evict("b"))
	_, err := e.Offer(ev("b", 2, "x", `{}`))
	require.ErrorIs(t, err, ErrNotLoaded)
}

func TestStateMarshalsToTheContractShape(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	withGap := State{Task: "report-7", Partition: 3, Version: 12, Status: "running", Data: json.RawMessage(`{"a":1}`), Seq: 8812,
		UpdatedAt: at, Gap: &GapInfo{NextVersion: 13, Buffered: 2, Since: at}}
	b, err := json.Marshal(withGap)
	require.NoError(t, err)
	require.JSONEq(t, `{"task":"report-7","partition":3,"version":12,"status":"running","data":{"a":1},"seq":8812,
		"updated_at":"2026-03-01T12:00:00.123456789Z",
		"gap":{"next_version":13,"buffered":2,"since":"2026-03-01T12:00:00.123456789Z"}}`, string(b))

	var back State
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, withGap, back)

	b, err = json.Marshal(State{Task: "new", UpdatedAt: at})
	require.NoError(t, err)
	require.JSONEq(t, `{"task":"new","partition":0,"version":0,"status":"","data":null,"seq":0,
		"updated_at":"2026-03-01T12:00:00.123456789Z","gap":null}`, string(b))

	b, err = json.Marshal(State{Task: "big", Version: 5, Status: "done", Data: json.RawMessage(`{"a":"xyz"}`), Seq: 9, UpdatedAt: at}.WithoutData())
	require.NoError(t, err)
	require.JSONEq(t, `{"task":"big","partition":0,"version":5,"status":"done","data":null,"data_too_large":11,"seq":9,
		"updated_at":"2026-03-01T12:00:00.123456789Z","gap":null}`, string(b), "docs/contract.md §6: data null and its size")
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	c := Config{}.WithDefaults()
	require.Equal(t, GapTimeoutDefault, c.GapTimeout)
	require.Equal(t, MaxBufferedPerTaskDefault, c.MaxBufferedPerTask)
	require.Equal(t, MaxBufferedDefault, c.MaxBuffered)
	require.Equal(t, MaxBufferedBytesDefault, c.MaxBufferedBytes)
	require.Equal(t, DedupWindowDefault, c.DedupWindow)
	require.Equal(t, MaxTasksDefault, c.MaxTasks)
	require.NotNil(t, c.Now)
	require.Equal(t, MergeReducer{}, c.Reducer)

	for _, bad := range []Config{
		{GapTimeout: -time.Second},
		{MaxBufferedPerTask: -1},
		{MaxBuffered: -1},
		{MaxBufferedBytes: -1},
		{DedupWindow: -1},
		{MaxTasks: -1},
		{MaxBufferedPerTask: 10, MaxBuffered: 5},
	} {
		_, err := New(bad)
		require.ErrorIs(t, err, ErrInvalidConfig, "%+v", bad)
	}
}
