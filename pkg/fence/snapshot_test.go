package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// snap is ev for a snapshot task.
func snap(l fence.Lease, task string, version int64) fence.Event {
	e := ev(l, task, version, "state")
	e.Snapshot = true
	return e
}

// A snapshot task commits a later version without waiting for the ones it
// skips, and still refuses what does not rise: the same version with other
// content (version_taken), and a skipped version arriving after a later one
// (overtaken). Both are recorded, so a redelivery gets them again. Whether
// the heads are cached (the fast path) or read (the careful path) makes no
// difference.
func TestSnapshotTaskSkipsVersionsButNeverGoesBack(t *testing.T) {
	t.Parallel()
	for _, careful := range []bool{false, true} {
		name := "heads cached"
		if careful {
			name = "careful path"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, db := newStore(t, fence.Config{})
			if careful {
				s = fence.WithoutFastPath(s)
			}
			l, err := s.Acquire(ctx, 2, "reports.a", time.Minute)
			require.NoError(t, err)

			first := appendOne(t, s, snap(l, "gauge-1", 3))
			require.Equal(t, wire.VerdictCommitted, first.Verdict, "a snapshot task may begin at any version: %s", first.Reason)
			require.True(t, first.Committed.Snapshot, "its log copy says it is a snapshot")
			skip := appendOne(t, s, snap(l, "gauge-1", 7))
			require.Equal(t, wire.VerdictCommitted, skip.Verdict, "version 7 does not wait for 4..6: %s", skip.Reason)

			head, err := s.TaskHead(ctx, "gauge-1")
			require.NoError(t, err)
			require.EqualValues(t, 7, head.Version)
			require.Equal(t, wire.KindSnapshot, head.Kind)

			same := snap(l, "gauge-1", 7)
			same.Payload = []byte(`{"other":true}`)
			taken := appendOne(t, s, same)
			require.Equal(t, wire.VerdictConflict, taken.Verdict)
			require.Equal(t, wire.ReasonVersionTaken, taken.Reason)

			late := snap(l, "gauge-1", 5)
			r := appendOne(t, s, late)
			require.Equal(t, wire.VerdictConflict, r.Verdict, "a skipped version arriving late never commits")
			require.Equal(t, wire.ReasonOvertaken, r.Reason)
			again := appendOne(t, s, late)
			require.Equal(t, wire.ReasonOvertaken, again.Reason)
			require.True(t, again.Repeat, "the verdict is recorded and repeated")

			dup := appendOne(t, s, fence.Event{ID: first.Committed.EventID, Partition: 2, Task: "gauge-1", Version: 3,
				Type: "state", Payload: first.Committed.Payload, Holder: l.Holder, Generation: l.Generation, Snapshot: true})
			require.Equal(t, wire.VerdictDuplicate, dup.Verdict)
			require.True(t, dup.Committed.Snapshot, "a duplicate's re-published copy says it is a snapshot")

			require.Equal(t, 2, countRows(t, db, `SELECT count(*) FROM ledger.events WHERE task_id = 'gauge-1'`))
			require.Equal(t, 2, countRows(t, db, `SELECT count(*) FROM ledger.rejections WHERE task_id = 'gauge-1'`))

			// The fence is unchanged: a snapshot of a superseded generation
			// is stale.
			require.NoError(t, s.Release(ctx, 2, l.Holder, l.Generation))
			b, err := s.TakeOver(ctx, 2, "reports.b", l.Generation, time.Minute)
			require.NoError(t, err)
			zombie := appendOne(t, s, snap(l, "gauge-1", 9))
			require.Equal(t, wire.VerdictStale, zombie.Verdict)
			require.Equal(t, wire.VerdictCommitted, appendOne(t, s, snap(b, "gauge-1", 8)).Verdict)
		})
	}
}

// An events task keeps its contract beside snapshot tasks: a version ahead
// of head + 1 waits, and is a gap once its window closed; too far ahead is
// a gap at once.
func TestEventsTaskStillWaitsAndGaps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, fence.Config{})
	l, err := s.Acquire(ctx, 2, "reports.a", time.Minute)
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, appendOne(t, s, ev(l, "report-1", 1, "running")).Verdict)
	early := ev(l, "report-1", 3, "running")
	require.Equal(t, fence.NotYet, appendOne(t, s, early).Verdict)
	early.Final = true
	r := appendOne(t, s, early)
	require.Equal(t, wire.VerdictGap, r.Verdict)
	require.Equal(t, wire.ReasonGapTimeout, r.Reason)
	head, err := s.TaskHead(ctx, "report-1")
	require.NoError(t, err)
	require.Equal(t, wire.KindEvents, head.Kind)
	require.EqualValues(t, 1, head.Version)
}

// A task's kind is chosen by its first commit and never changes: an event
// of the other kind is invalid/wrong_kind, recorded (the verdict lookup
// answers it), in either direction, within one batch too.
func TestTaskKindCannotChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newStore(t, fence.Config{})
	l, err := s.Acquire(ctx, 2, "reports.a", time.Minute)
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, appendOne(t, s, ev(l, "report-1", 1, "running")).Verdict)
	require.Equal(t, wire.VerdictCommitted, appendOne(t, s, snap(l, "gauge-1", 1)).Verdict)

	fresh, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	for _, writer := range []*fence.Store{s, fresh} {
		toSnap := snap(l, "report-1", 2)
		r := appendOne(t, writer, toSnap)
		require.Equal(t, wire.VerdictInvalid, r.Verdict)
		require.Equal(t, wire.ReasonWrongKind, r.Reason)
		rec, ok, err := s.Verdict(ctx, "report-1", toSnap.ID)
		require.NoError(t, err)
		require.True(t, ok, "the verdict lookup answers it")
		require.Equal(t, wire.ReasonWrongKind, rec.Reason)

		toEvents := ev(l, "gauge-1", 2, "state")
		r = appendOne(t, writer, toEvents)
		require.Equal(t, wire.VerdictInvalid, r.Verdict)
		require.Equal(t, wire.ReasonWrongKind, r.Reason)
	}

	both := []fence.Event{snap(l, "mixed-1", 1), ev(l, "mixed-1", 2, "running")}
	res, err := s.Append(ctx, both)
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[0].Verdict)
	require.Equal(t, wire.ReasonWrongKind, res[1].Reason, "the batch's own first commit pins the kind")

	for task, kind := range map[string]string{"report-1": wire.KindEvents, "gauge-1": wire.KindSnapshot, "mixed-1": wire.KindSnapshot} {
		head, err := s.TaskHead(ctx, task)
		require.NoError(t, err)
		require.Equal(t, kind, head.Kind, task)
		require.EqualValues(t, 1, head.Version, task)
	}
}
