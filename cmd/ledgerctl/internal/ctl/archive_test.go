package ctl_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// withSmallPartitions remakes the (empty) ledger's partitions with rows
// rows each, so that a test archives after a few hundred events.
func (e *env) withSmallPartitions(rows int) *env {
	e.t.Helper()
	ctx := context.Background()
	names, err := e.db.Pool.Query(ctx, `SELECT name FROM ledger.event_partitions`)
	require.NoError(e.t, err)
	list, err := pgx.CollectRows(names, pgx.RowTo[string])
	require.NoError(e.t, err)
	for _, n := range list {
		_, err := e.db.Pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{"ledger", n}.Sanitize())
		require.NoError(e.t, err)
	}
	_, err = e.db.Pool.Exec(ctx, `DELETE FROM ledger.event_partitions`)
	require.NoError(e.t, err)
	_, err = e.db.Pool.Exec(ctx, `UPDATE ledger.partitioning SET rows_per_partition = $1, partitions_ahead = 10`, rows)
	require.NoError(e.t, err)
	e.store, err = fence.New(e.db.Pool, fence.Config{})
	require.NoError(e.t, err)
	_, _, err = e.store.EnsurePartitions(ctx)
	require.NoError(e.t, err)
	return e
}

// appendVersions commits versions 1..n of task on the lease's partition.
func (e *env) appendVersions(l fence.Lease, task string, n int) {
	e.t.Helper()
	for v := 1; v <= n; {
		batch := make([]fence.Event, 0, 50)
		for ; v <= n && len(batch) < 50; v++ {
			batch = append(batch, fence.Event{ID: newID(), Partition: l.Partition, Task: task, Version: int64(v),
				Type: "step", Payload: []byte(fmt.Sprintf(`{"v":%d}`, v)), Holder: l.Holder, Generation: l.Generation})
		}
		res, err := e.store.Append(context.Background(), batch)
		require.NoError(e.t, err)
		for _, r := range res {
			require.Equal(e.t, wire.VerdictCommitted, r.Verdict)
		}
	}
}

// The retention story end to end: a snapshot, an archive, a task that says
// which of its versions are archived, and rebuilds that refuse the hot log
// alone and accept the snapshot or the archive.
func TestArchiveSnapshotTaskAndRebuild(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withSmallPartitions(100)
	l := e.acquire(4, "reports.pod-a")
	e.appendVersions(l, "report-7", 3)
	e.appendVersions(l, "busy", 247)
	dir := t.TempDir()
	snap := filepath.Join(t.TempDir(), "tasks.snap")

	e.run("rebuild").ok(t)
	r := e.run("snapshot", "-out", snap).ok(t)
	require.Contains(t, r.stdout, "wrote 2 projections")

	r = e.run("archive", "-dir", dir, "-before-seq", "201", "-dry-run").ok(t)
	require.Contains(t, r.stdout, "would archive 2 partitions (seq 1..200); nothing changed")
	r = e.run("archive", "-dir", dir, "-before-seq", "201").ok(t)
	require.Contains(t, r.stdout, "archived 200 events from 2 partitions")
	require.Contains(t, r.stdout, "history below seq 201 is archived")
	require.Contains(t, r.stderr, "dropped")
	r = e.run("archive", "-dir", dir, "-before-seq", "201", "-json").ok(t)
	last := r.jsonLines(t)
	require.Equal(t, "archive", last[len(last)-1]["kind"])
	require.EqualValues(t, 0, last[len(last)-1]["rows"], "already archived")

	r = e.run("task", "report-7").ok(t)
	require.Contains(t, r.stdout, "versions 1..3 are archived (history below seq 201)")
	r = e.run("task", "report-7", "-json").ok(t)
	require.Equal(t, "archived", r.jsonLines(t)[0]["kind"])
	require.EqualValues(t, 3, r.jsonLines(t)[0]["versions"])

	r = e.run("rebuild")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "history is archived below seq 201")
	require.Contains(t, r.stderr, "-snapshot FILE, -archive DIR, or -hot-only")
	require.Contains(t, e.run("rebuild", "-snapshot", snap).ok(t).stdout, "rebuilt 50 events")
	require.Contains(t, e.run("rebuild", "-archive", dir).ok(t).stdout, "rebuilt 250 events")
	require.Equal(t, 2, e.run("rebuild", "-archive", dir, "-snapshot", snap).code)

	for _, args := range [][]string{
		{"archive", "-before-seq", "10"},
		{"archive", "-dir", dir},
		{"archive", "-dir", dir, "-older-than", "1h", "-before", "2026-01-01T00:00:00Z"},
		{"archive", "-dir", dir, "-before", "yesterday"},
		{"snapshot"},
	} {
		require.Equal(t, 2, e.run(args...).code, "%v", args)
	}
}
