package console

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// A task whose first versions were archived has only the rest in its log:
// their fold is not the task's projection, and the page must not call the
// stored projection wrong for that. It says why it does not compare.
func TestTaskWithArchivedVersionsIsNotComparedWithAPartialFold(t *testing.T) {
	t.Parallel()
	stored := json.RawMessage(`{"task":"t","partition":1,"version":3,"status":"running","seq":30,"data":{"a":1,"b":2}}`)
	task := Task{ID: "t", Projection: TaskProjection{Revision: 3, Value: stored},
		Events: []TaskEvent{{Seq: 30, Partition: 1, Version: 3, Type: "running", Payload: json.RawMessage(`{"b":2}`)}}}

	// Without the archive, the fold of version 3 alone differs: that is
	// what an archived task would have shown.
	partial := taskComparison("t", task)
	require.False(t, partial.Match)
	require.NotEmpty(t, partial.Differences)

	task.Archived = "versions 1..2 are archived (history below seq 21)"
	c := taskComparison("t", task)
	require.False(t, c.Match)
	require.Empty(t, c.Differences, "no difference is claimed")
	require.Contains(t, c.Note, "versions 1..2 are archived")
}

// A snapshot task's log has holes: the page folds it as the projector does,
// the newest snapshot, and so finds the stored projection right.
func TestSnapshotTaskIsComparedWithItsNewestSnapshot(t *testing.T) {
	t.Parallel()
	stored := json.RawMessage(`{"task":"g","partition":1,"version":7,"status":"reading","seq":40,"data":{"temp":23},"kind":"snapshot"}`)
	task := Task{ID: "g", Snapshot: true, Projection: TaskProjection{Revision: 2, Value: stored},
		Events: []TaskEvent{
			{Seq: 31, Partition: 1, Version: 3, Type: "reading", Payload: json.RawMessage(`{"temp":20,"unit":"C"}`)},
			{Seq: 40, Partition: 1, Version: 7, Type: "reading", Payload: json.RawMessage(`{"temp":23}`)},
		}}
	c := taskComparison("g", task)
	require.True(t, c.Match, "%v %s", c.Differences, c.Note)
	require.Empty(t, c.Differences)

	task.Snapshot = false
	require.False(t, taskComparison("g", task).Match, "folded event by event, version 7 would wait for 4")
}
