package fence_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// An event whose receipt was lost is judged again by nobody: the ledger
// answers with what it recorded for the id, and with nothing while it has
// recorded nothing.
func TestVerdictOfAnEventIsWhatTheLedgerRecorded(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	old, err := s.Acquire(ctx, 3, "worker-a.1", longTTL)
	require.NoError(t, err)
	expire(t, db, 3)
	cur, err := s.Acquire(ctx, 3, "worker-a.2", longTTL)
	require.NoError(t, err)

	committed := appendOne(t, s, ev(cur, "job", 1, "start"))
	stale := ev(old, "job", 2, "late")
	conflict := ev(cur, "job", 1, "other")
	gap := ev(cur, "job", 9, "far")
	gap.Final = true
	pending := ev(cur, "job", 5, "early")
	wrongPartition := ev(fence.Lease{Partition: 4, Holder: "worker-a.2", Generation: 1}, "job", 2, "elsewhere")
	// The committed event's id, reused under another task: rejected there,
	// and still committed under its own.
	reused := ev(cur, "other-job", 1, "start")
	reused.ID = committed.Committed.EventID
	// And under its own task, at another version: that copy is rejected,
	// but the id's committed row is what the event is.
	reusedHere := ev(cur, "job", 2, "next")
	reusedHere.ID = committed.Committed.EventID
	for _, tc := range []struct {
		e       fence.Event
		verdict wire.Verdict
	}{
		{stale, wire.VerdictStale}, {conflict, wire.VerdictConflict}, {gap, wire.VerdictGap},
		{pending, fence.NotYet}, {wrongPartition, wire.VerdictInvalid},
		{reused, wire.VerdictConflict}, {reusedHere, wire.VerdictConflict},
	} {
		require.Equal(t, tc.verdict, appendOne(t, s, tc.e).Verdict, "%+v", tc.e)
	}
	// A later copy of the stale event, even one stamped otherwise, gets
	// the first verdict again: it is the one that stands.
	staleAgain := stale
	staleAgain.Generation = cur.Generation + 7
	again := appendOne(t, s, staleAgain)
	require.Equal(t, wire.ReasonSuperseded, again.Reason)
	require.True(t, again.Repeat)

	for _, tc := range []struct {
		name  string
		task  string
		id    string
		found bool
		want  fence.Recorded
	}{
		{"committed, though a reuse of its id was rejected", "job", committed.Committed.EventID, true,
			fence.Recorded{Verdict: wire.VerdictCommitted, Seq: committed.Seq}},
		{"stale, first verdict of two copies", "job", stale.ID, true,
			fence.Recorded{Verdict: wire.VerdictStale, Reason: wire.ReasonSuperseded}},
		{"conflict", "job", conflict.ID, true,
			fence.Recorded{Verdict: wire.VerdictConflict, Reason: wire.ReasonVersionTaken}},
		{"gap", "job", gap.ID, true,
			fence.Recorded{Verdict: wire.VerdictGap, Reason: wire.ReasonGapTimeout}},
		{"id reused under another task", "other-job", reused.ID, true,
			fence.Recorded{Verdict: wire.VerdictConflict, Reason: wire.ReasonEventIDReused}},
		{"not judged yet", "job", pending.ID, false, fence.Recorded{}},
		{"invalid: not recorded", "job", wrongPartition.ID, false, fence.Recorded{}},
		{"never published", "job", newID(), false, fence.Recorded{}},
		{"committed id asked under another task", "third-job", committed.Committed.EventID, false, fence.Recorded{}},
	} {
		got, found, err := s.Verdict(ctx, tc.task, tc.id)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.found, found, tc.name)
		tc.want.EventID = tc.id
		if found {
			require.Equal(t, tc.want, got, tc.name)
		}
	}

	// A batch answers each lookup as it is answered alone, in the order
	// asked, content compared or not, and a repeated lookup twice.
	// Switch: judged (lookup.go) not comparing content: lookup 1 differs.
	start := committed.Committed
	same := &fence.Content{Version: 1, Type: "start", Payload: []byte(` { "by":"worker-a.2", "v":1 }`)}
	other := &fence.Content{Version: 1, Type: "start", Payload: []byte(`{"v":2}`)}
	lookups := []fence.Lookup{
		{Task: "job", EventID: start.EventID, Content: same},
		{Task: "job", EventID: start.EventID, Content: other},
		{Task: "job", EventID: start.EventID},
		{Task: "other-job", EventID: reused.ID, Content: same},
		{Task: "job", EventID: stale.ID, Content: same},
		{Task: "job", EventID: conflict.ID},
		{Task: "job", EventID: gap.ID},
		{Task: "job", EventID: pending.ID},
		{Task: "third-job", EventID: start.EventID},
		{Task: "never-seen", EventID: newID()},
		{Task: "job", EventID: start.EventID, Content: same},
	}
	batch := lookedUpAsAlone(t, s, lookups)
	require.Equal(t, wire.VerdictCommitted, batch[0].Recorded.Verdict)
	require.Equal(t, wire.ReasonEventIDReused, batch[1].Recorded.Reason)
}

func TestVerdictRefusesMalformedIDs(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, fence.Config{})
	for _, tc := range []struct{ task, id string }{
		{"job", "not-a-ulid"},
		{"job", ""},
		{"job", "01J0000000000000000000000!"},
		{"bad task", newID()},
		{"", newID()},
	} {
		_, _, err := s.Verdict(context.Background(), tc.task, tc.id)
		require.ErrorIs(t, err, fence.ErrInvalid, "%q %q", tc.task, tc.id)
		require.Less(t, len(err.Error()), 200)
	}
}

// lookedUpAsAlone asks VerdictsFor for lookups, checks that each answer is
// what TaskHead and VerdictFor answer for it alone, and returns them.
func lookedUpAsAlone(t *testing.T, s *fence.Store, lookups []fence.Lookup) []fence.Looked {
	t.Helper()
	ctx := context.Background()
	batch, err := s.VerdictsFor(ctx, lookups)
	require.NoError(t, err)
	require.Len(t, batch, len(lookups))
	for i, l := range lookups {
		rec, found, err := s.VerdictFor(ctx, l.Task, l.EventID, l.Content)
		require.NoError(t, err)
		head, err := s.TaskHead(ctx, l.Task)
		require.NoError(t, err)
		head.Archived = 0 // VerdictsFor leaves it out: a lookup's reply does not carry it
		require.Equal(t, fence.Looked{Head: head, Recorded: rec, Found: found}, batch[i], "lookup %d: %+v", i, l)
	}
	return batch
}
