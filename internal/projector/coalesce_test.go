package projector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// backlog commits versions events to each of tasks tasks and puts their
// copies on LEDGER_LOG round robin, as a busy ledger interleaves them:
// every task's version 1, then every task's version 2, ...
func (e *env) backlog(tasks, versions int) map[string][]committed {
	e.t.Helper()
	all := map[string][]committed{}
	for k := range tasks {
		task := fmt.Sprintf("t-%d", k)
		types, payloads := make([]string, versions), make([]string, versions)
		for v := range versions {
			types[v], payloads[v] = "step", fmt.Sprintf(`{"v%d":%d,"last":%d}`, v%3, v, v)
		}
		all[task] = e.commit(k%16, task, types, payloads)
	}
	for v := range versions {
		for k := range tasks {
			e.publishLog(all[fmt.Sprintf("t-%d", k)][v])
		}
	}
	return all
}

// bucketWrites is how many values the bucket ledger_tasks has ever stored:
// its stream's last sequence, counted by the server.
func (e *env) bucketWrites() uint64 {
	e.t.Helper()
	str, err := e.js.Stream(context.Background(), "KV_"+wire.BucketTasks)
	require.NoError(e.t, err)
	info, err := str.Info(context.Background())
	require.NoError(e.t, err)
	return info.State.LastSeq
}

// requireFolded checks that every task's value is the fold of all its
// versions, with no gap.
func (e *env) requireFolded(all map[string][]committed) {
	e.t.Helper()
	for task, events := range all {
		st, ok := e.state(task)
		require.True(e.t, ok, task)
		require.EqualValues(e.t, len(events), st.Version, task)
		require.Nil(e.t, st.Gap, task)
		status, data := fold(e.t, events)
		require.Equal(e.t, status, st.Status, task)
		jsonEq(e.t, data, st.Data, task)
	}
}

// A turn writes each task's value once, however many of its versions the
// batch holds: 3 tasks × 5 versions in one batch are 3 bucket writes.
// Switch: write each changed state as it is offered (offer in turn.go
// calling writeAll per event) and the server counts 15.
func TestATurnWritesEachTaskOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	all := e.backlog(3, 5)
	reg := prometheus.NewRegistry()
	p := e.newProjector(projector.Config{}, reg)
	ctx := context.Background()
	cons, err := p.Prepare(ctx)
	require.NoError(t, err)

	p.Turn(ctx, fetch(t, cons, 15))
	require.EqualValues(t, 3, e.bucketWrites(), "one value per task")
	require.EqualValues(t, 3, metric(t, reg, "ledger_projector_kv_writes_total"))
	require.EqualValues(t, 15, metric(t, reg, "ledger_projector_events_total", "outcome", string(projection.OutcomeApplied)))
	e.requireFolded(all)
}

// A projector that starts behind takes more than a batch a turn while the
// backlog lasts, and so writes each task fewer times than it has versions,
// in order and whole. Here batches of 10 over 10 interleaved tasks could
// hold no task twice: 200 writes for 200 events; catch-up turns need at
// most half. Switch: CatchUpBatchSize equal to BatchSize (fill in turn.go
// stops at a batch) and the server counts 200.
func TestCatchUpTurnsWriteATaskOnceForSeveralVersions(t *testing.T) {
	t.Parallel()
	const tasks, versions = 10, 20
	e := newEnv(t)
	all := e.backlog(tasks, versions)
	// A generous wait: a loaded machine must not end catch-up turns early.
	e.start(projector.Config{BatchSize: tasks, CatchUpBatchSize: 1000, CatchUpWait: time.Second})
	for task := range all {
		e.waitState(task, 30*time.Second, func(s projection.State) bool { return s.Version == versions })
	}
	e.requireFolded(all)
	writes := e.bucketWrites()
	t.Logf("%d bucket writes for %d events", writes, tasks*versions)
	require.LessOrEqual(t, writes, uint64(tasks*versions/2), "catch-up turns coalesce a task's versions")
}
