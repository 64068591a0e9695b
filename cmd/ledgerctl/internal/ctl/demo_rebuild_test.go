package ctl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

func TestDemoCommandPlaysTheStoriesAndExitsZero(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	r := run(t, "demo", "-database-url", db.URL).ok(t)
	require.Contains(t, r.stdout, "stale/superseded")
	require.Contains(t, r.stdout, "Summary")
}

// rebuild replays the database into the bucket: a task whose events are in
// PostgreSQL (and were never projected) gets its projection.
func TestRebuildCommandProjectsTheDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	require.NoError(t, streams.Apply(ctx, e.js, streams.Options{}))
	l := e.acquire(4, "worker-a.1")
	var events []fence.Event
	for v := int64(1); v <= 3; v++ {
		events = append(events, fence.Event{ID: newID(), Partition: 4, Task: "report-9", Version: v, Type: "step",
			Payload: []byte(fmt.Sprintf(`{"v":%d}`, v)), Holder: l.Holder, Generation: l.Generation})
	}
	res, err := e.store.Append(ctx, events)
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[2].Verdict)

	r := e.run("rebuild").ok(t)
	require.Contains(t, r.stdout, "rebuilt 3 events")
	require.True(t, strings.Contains(r.stderr, "3/3 events"), "progress line: %q", r.stderr)

	kv, err := e.js.KeyValue(ctx, wire.BucketTasks)
	require.NoError(t, err)
	entry, err := kv.Get(ctx, "report-9")
	require.NoError(t, err)
	var st projection.State
	require.NoError(t, json.Unmarshal(entry.Value(), &st))
	require.EqualValues(t, 3, st.Version)
	require.JSONEq(t, `{"v":3}`, string(st.Data))
	_, err = e.js.Consumer(ctx, wire.StreamLog, "projector")
	require.NoError(t, err, "the projector's consumer was recreated for the projectors to resume from")

	require.Equal(t, 2, run(t, "rebuild", "-partitions", "99").code, "a bad partition set is a usage error")
}

// demo -external plays the stories against services that already run.
func TestDemoExternalUsesTheRunningLedger(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withIngest(ingest.Config{})
	p, err := projector.New(projector.Config{}, projector.Deps{NC: e.ns.Conn(t), Pool: e.db.Pool, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(p.Stop)

	r := e.run("demo", "-external").ok(t)
	require.Contains(t, r.stdout, "using the running ledger")
	require.NotContains(t, r.stdout, "embedded")
	require.Contains(t, r.stdout, "stale/superseded")
	require.Equal(t, 2, run(t, "demo", "-external", "-database-url", "").code, "-external without a database is a usage error")
}
