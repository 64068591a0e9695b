package fence

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// The contract's order of checks, decided from tables alone: one event in
// a batch, against a task whose head is version 3 on partition 1, leased to
// w at generation 5.
func TestClassifyDecidesInTheContractsOrder(t *testing.T) {
	t.Parallel()
	const id = "01J00000000000000000000001"
	base := Event{ID: id, Partition: 1, Task: "t", Version: 4, Type: "step", Payload: []byte(`{"a":1}`), Holder: "w.1", Generation: 5}
	with := func(f func(*Event)) Event { e := base; f(&e); return e }
	storedRow := &stored{c: Committed{Seq: 9, EventID: id, Partition: 1, Task: "t", Version: 4, Type: "step"}, samePayload: true, hot: true}
	// Archived: every event below seq 100, and the ids minted before 01K.
	archived := horizon{belowSeq: 100, idFloor: "01K0000000"}
	for _, c := range []struct {
		name     string
		e        Event
		lease    *leaseState
		existing existing
		recorded *recorded
		horizon  horizon
		verdict  wire.Verdict
		reason   string
	}{
		{name: "head + 1 commits", e: base, verdict: wire.VerdictCommitted},
		{name: "ahead waits", e: with(func(e *Event) { e.Version = 6 }), verdict: NotYet},
		{name: "ahead after the window is a gap", e: with(func(e *Event) { e.Version, e.Final = 6, true }),
			verdict: wire.VerdictGap, reason: wire.ReasonGapTimeout},
		{name: "a gap keeps the reason it was given", e: with(func(e *Event) { e.Version, e.Final, e.GapReason = 6, true, wire.ReasonTooManyWaiting }),
			verdict: wire.VerdictGap, reason: wire.ReasonTooManyWaiting},
		{name: "too far ahead is a gap at once", e: with(func(e *Event) { e.Version = 3 + MaxAheadDefault + 1 }),
			verdict: wire.VerdictGap, reason: wire.ReasonTooFarAhead},
		{name: "an older generation is superseded", e: with(func(e *Event) { e.Generation = 4 }),
			verdict: wire.VerdictStale, reason: wire.ReasonSuperseded},
		{name: "another holder is not the holder", e: with(func(e *Event) { e.Holder = "x.1" }),
			verdict: wire.VerdictStale, reason: wire.ReasonNotHolder},
		{name: "an expired lease", e: base, lease: &leaseState{holder: "w.1", gen: 5},
			verdict: wire.VerdictStale, reason: wire.ReasonLeaseExpired},
		{name: "another partition is wrong", e: with(func(e *Event) { e.Partition = 2 }),
			verdict: wire.VerdictInvalid, reason: wire.ReasonWrongPartition},
		{name: "the same id and content is a duplicate", e: base, existing: existing{byID: storedRow, looked: true},
			verdict: wire.VerdictDuplicate, reason: wire.ReasonSameEventID},
		{name: "a taken version is a conflict", e: with(func(e *Event) { e.Version = 3 }),
			existing: existing{byTV: &stored{c: Committed{Seq: 8, EventID: "01J00000000000000000000002", Task: "t", Version: 3, Type: "other"}, hot: true}, looked: true},
			verdict:  wire.VerdictConflict, reason: wire.ReasonVersionTaken},
		{name: "an id committed in archived history is a conflict", e: base, horizon: archived,
			existing: existing{byID: &stored{c: Committed{Seq: 9}}, looked: true},
			verdict:  wire.VerdictConflict, reason: wire.ReasonArchived},
		{name: "a version below the head whose row is archived is a conflict", e: with(func(e *Event) { e.ID, e.Version = "01M00000000000000000000001", 2 }),
			horizon: archived, existing: existing{looked: true}, verdict: wire.VerdictConflict, reason: wire.ReasonArchived},
		{name: "an id minted before the floor and not in the hot log is refused", e: base, horizon: archived,
			existing: existing{looked: true}, verdict: wire.VerdictInvalid, reason: wire.ReasonBeforeHorizon},
		{name: "an id minted before the floor and in the hot log is a duplicate", e: base, horizon: archived,
			existing: existing{byID: storedRow, looked: true}, verdict: wire.VerdictDuplicate, reason: wire.ReasonSameEventID},
		{name: "a recorded rejection of an id before the floor stands", e: base, horizon: archived,
			recorded: &recorded{verdict: wire.VerdictGap, reason: wire.ReasonGapTimeout},
			existing: existing{looked: true}, verdict: wire.VerdictGap, reason: wire.ReasonGapTimeout},
		{name: "a recorded rejection stands", e: base, recorded: &recorded{verdict: wire.VerdictGap, reason: wire.ReasonGapTimeout},
			existing: existing{looked: true}, verdict: wire.VerdictGap, reason: wire.ReasonGapTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Store{cfg: Config{}.WithDefaults()}
			res := make([]Result, 1)
			b := s.prepare([]Event{c.e}, res)
			require.Len(t, b.order, 1, "%+v", res[0])
			lease := leaseState{holder: "w.1", gen: 5, valid: true}
			if c.lease != nil {
				lease = *c.lease
			}
			z := c.horizon
			if z.belowSeq == 0 {
				z.belowSeq = 1
			}
			st := state{leases: map[int]leaseState{1: lease, 2: lease}, heads: map[string]taskHead{"t": {partition: 1, version: 3, firstSeq: 7}},
				existing: []existing{c.existing}, recorded: map[string]recorded{}, horizon: z}
			if c.recorded != nil {
				st.recorded[id] = *c.recorded
			}
			p, err := s.classify(b, st, res)
			require.NoError(t, err)
			got := res[0].Verdict
			if len(p.commits) == 1 {
				got = wire.VerdictCommitted
			}
			require.Equal(t, c.verdict, got)
			require.Equal(t, c.reason, res[0].Reason)
		})
	}
}

// Within one batch, a task's consecutive versions all commit, and a second
// copy of one event follows the first.
func TestClassifyPlansABatchInVersionOrder(t *testing.T) {
	t.Parallel()
	s := &Store{cfg: Config{}.WithDefaults()}
	ev := func(id string, v int64) Event {
		return Event{ID: id, Partition: 0, Task: "t", Version: v, Type: "step", Payload: []byte(`{}`), Holder: "w.1", Generation: 1}
	}
	events := []Event{ev("01J00000000000000000000003", 3), ev("01J00000000000000000000001", 1),
		ev("01J00000000000000000000002", 2), ev("01J00000000000000000000001", 1)}
	res := make([]Result, len(events))
	b := s.prepare(events, res)
	st := state{leases: map[int]leaseState{0: {holder: "w.1", gen: 1, valid: true}}, heads: map[string]taskHead{},
		existing: make([]existing, len(b.order)), recorded: map[string]recorded{}}
	p, err := s.classify(b, st, res)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 0}, p.commits, "versions 1, 2, 3 in order")
	require.Equal(t, map[int]int{3: 1}, p.follows, "the second copy follows the first")
	require.Equal(t, wire.ReasonSameEventID, res[3].Reason)
}
