package projection

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// chaosWorld is one run of the property test: the true committed log of a few
// tasks, an engine with small random caps on a fake clock, and the record of
// every version the reducer applied.
type chaosWorld struct {
	t       *rapid.T
	e       *Engine
	clock   *fakeClock
	cfg     Config
	log     map[string][]Event // task -> versions 1..n
	applied map[string][]int64 // task -> versions in the order the reducer saw them
}

// recordingReducer wraps MergeReducer and fails the test if it is ever asked
// to apply anything but the next version.
func (w *chaosWorld) recordingReducer() Reducer {
	return ReducerFunc(func(s State, ev Event) (State, error) {
		if ev.Version != s.Version+1 {
			w.t.Fatalf("task %s: reducer got version %d on top of %d", ev.Task, ev.Version, s.Version)
		}
		w.applied[ev.Task] = append(w.applied[ev.Task], ev.Version)
		return MergeReducer{}.Reduce(s, ev)
	})
}

// offer offers one event and checks what must hold after every call.
func (w *chaosWorld) offer(ev Event) {
	res, err := w.e.Offer(ev)
	require.NoError(w.t, err, "offer %s v%d", ev.Task, ev.Version)
	require.NotEqual(w.t, OutcomeConflict, res.Outcome)
	w.checkCaps()
}

func (w *chaosWorld) checkCaps() {
	s := w.e.Stats()
	require.LessOrEqual(w.t, s.Buffered, w.cfg.MaxBuffered)
	require.LessOrEqual(w.t, s.BufferedBytes, w.cfg.MaxBufferedBytes)
	for id := range w.log {
		st, ok := w.e.State(id)
		require.True(w.t, ok)
		if st.Gap != nil {
			require.LessOrEqual(w.t, st.Gap.Buffered, w.cfg.MaxBufferedPerTask)
			require.Equal(w.t, st.Version+1, st.Gap.NextVersion)
		}
	}
}

// respell returns the payload as a jsonb column would give it back:
// different whitespace and key order, same value.
func respell(p json.RawMessage) json.RawMessage {
	var v any
	d := json.NewDecoder(bytes.NewReader(p))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		panic(err)
	}
	out, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		panic(err)
	}
	return out
}

// serve answers refetch requests from the true log, as the projector does
// from Postgres: the versions asked for, in order, in the database spelling.
func (w *chaosWorld) serve() int {
	due := w.e.DueRefetches()
	for _, r := range due {
		log := w.log[r.Task]
		require.GreaterOrEqual(w.t, r.FromVersion, int64(1))
		to := r.ToVersion
		if r.CatchUp {
			require.Zero(w.t, to)
			to = int64(len(log))
		}
		require.GreaterOrEqual(w.t, to, r.FromVersion, "refetch %+v asks for nothing", r)
		require.LessOrEqual(w.t, to, int64(len(log)), "refetch %+v asks for versions never committed", r)
		for v := r.FromVersion; v <= to; v++ {
			ev := log[v-1]
			ev.Payload = respell(ev.Payload)
			w.offer(ev)
		}
	}
	return len(due)
}

// For any interleaving, duplication and loss of a few tasks' committed events,
// with the losses filled by re-fetch, every task ends at the fold of its log,
// each version applied exactly once and in order, and the buffers stay within
// their caps throughout.
func TestEngineConvergesUnderReorderDuplicationAndLoss(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		perTask := rapid.IntRange(1, 6).Draw(rt, "maxBufferedPerTask")
		w := &chaosWorld{t: rt, log: map[string][]Event{}, applied: map[string][]int64{}}
		w.cfg = Config{
			GapTimeout:         time.Second,
			MaxBufferedPerTask: perTask,
			MaxBuffered:        rapid.IntRange(perTask, 12).Draw(rt, "maxBuffered"),
			MaxBufferedBytes:   rapid.IntRange(64, 2048).Draw(rt, "maxBufferedBytes"),
			DedupWindow:        rapid.IntRange(1, 8).Draw(rt, "dedupWindow"),
			Reducer:            w.recordingReducer(),
		}
		w.e, w.clock = newEngine(rt, w.cfg)

		// The true log, and the start of each task: new, or resumed from the
		// stored fold of a prefix, as after a restart.
		var deliveries []Event
		seq := int64(0)
		resumedAt := map[string]int64{}
		for k := range rapid.IntRange(1, 3).Draw(rt, "tasks") {
			id := fmt.Sprintf("task-%d", k)
			n := rapid.IntRange(0, 25).Draw(rt, "events")
			for v := int64(1); v <= int64(n); v++ {
				seq++
				payload := spell(rt, rapid.OneOf(jsonObject(2), jsonObject(2), jsonValue(1)).Draw(rt, "payload"), false)
				w.log[id] = append(w.log[id], Event{Task: id, Partition: k, Version: v, Seq: seq,
					Type: rapid.SampledFrom([]string{"started", "running", "done"}).Draw(rt, "type"), Payload: json.RawMessage(payload)})
			}
			from := rapid.IntRange(0, n).Draw(rt, "resumeAt")
			resumedAt[id] = int64(from)
			stored := fold(rt, State{Task: id}, w.log[id][:from])
			require.NoError(rt, w.e.Load(stored))

			// Each event is lost, delivered once, or delivered again and
			// again; the last is always delivered, or nobody could know of it.
			for v, ev := range w.log[id] {
				copies := rapid.IntRange(0, 3).Draw(rt, "copies")
				if v == n-1 && copies == 0 {
					copies = 1
				}
				for range copies {
					deliveries = append(deliveries, ev)
				}
			}
		}
		deliveries = rapid.Permutation(deliveries).Draw(rt, "order")

		for _, ev := range deliveries {
			w.offer(ev)
			if rapid.IntRange(0, 4).Draw(rt, "tick") == 0 {
				w.clock.Advance(time.Duration(rapid.IntRange(0, 1500).Draw(rt, "ms")) * time.Millisecond)
				w.serve()
			}
		}
		// The log is quiet now; the projector keeps polling.
		for round := 0; w.e.Stats().Waiting > 0; round++ {
			require.Less(rt, round, 100, "the engine does not converge")
			w.clock.Advance(w.cfg.GapTimeout)
			w.serve()
		}

		for id, log := range w.log {
			want := fold(rt, State{Task: id}, log)
			got, ok := w.e.State(id)
			require.True(rt, ok)
			require.Equal(rt, want.Version, got.Version, id)
			require.Equal(rt, want.Status, got.Status, id)
			require.Equal(rt, want.Seq, got.Seq, id)
			require.JSONEq(rt, dataString(want.Data), dataString(got.Data), id)
			require.Nil(rt, got.Gap, id)

			var wantApplied []int64
			for v := resumedAt[id] + 1; v <= int64(len(log)); v++ {
				wantApplied = append(wantApplied, v)
			}
			require.Equal(rt, wantApplied, w.applied[id], "%s: every version exactly once, in order", id)
		}
		require.Equal(rt, 0, w.e.Stats().Buffered)
	})
}

// fold is the specification: the reducer over the ordered log.
func fold(t require.TestingT, st State, log []Event) State {
	for _, ev := range log {
		next, err := MergeReducer{}.Reduce(st, ev)
		require.NoError(t, err)
		next.Version, next.Seq, next.Partition = ev.Version, ev.Seq, ev.Partition
		st = next
	}
	return st
}
