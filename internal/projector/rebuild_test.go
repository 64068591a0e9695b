package projector_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
)

// seedLog commits tasks×versions events in one statement and puts their
// copies on LEDGER_LOG in commit order, as the ingest would.
func (e *env) seedLog(tasks, versions int) {
	e.t.Helper()
	e.seedDB(tasks, versions)
	e.publishAllLog()
}

// seedDB commits tasks×versions events in one statement.
func (e *env) seedDB(tasks, versions int) {
	e.t.Helper()
	ctx := context.Background()
	_, err := e.db.Pool.Exec(ctx, `
		INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
		SELECT 'e-' || t || '-' || v, t % 16, 'task-' || t, v,
		       CASE WHEN v = $2 THEN 'completed' ELSE 'progress' END,
		       jsonb_build_object('step', v, 'k' || (v % 5), t, 'last', CASE WHEN v % 7 = 0 THEN NULL ELSE v END),
		       'worker-a.1', 1, clock_timestamp()
		FROM generate_series(1, $2) v, generate_series(1, $1) t ORDER BY v, t`, tasks, versions)
	require.NoError(e.t, err)
}

// publishAllLog puts every committed event's copy on LEDGER_LOG in seq order.
func (e *env) publishAllLog() {
	e.t.Helper()
	ctx := context.Background()
	js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(4000))
	require.NoError(e.t, err)
	rows, err := e.db.Pool.Query(ctx, `SELECT seq, event_id, partition, task_id, version, type, payload::text FROM ledger.events ORDER BY seq`)
	require.NoError(e.t, err)
	for rows.Next() {
		var c committed
		require.NoError(e.t, rows.Scan(&c.seq, &c.id, &c.partition, &c.task, &c.version, &c.typ, &c.payload))
		_, err := js.PublishMsgAsync(e.subj.LogMsg(c.logCopy()), jetstream.WithStallWait(30*time.Second))
		require.NoError(e.t, err)
	}
	require.NoError(e.t, rows.Err())
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		e.t.Fatal("log copies not acknowledged")
	}
}

// snapshot reads every projection in the bucket.
func (e *env) snapshot() map[string]projection.State {
	e.t.Helper()
	ctx := context.Background()
	lister, err := e.bucket().ListKeys(ctx)
	require.NoError(e.t, err)
	out := map[string]projection.State{}
	for key := range lister.Keys() {
		st, ok := e.state(key)
		require.True(e.t, ok)
		out[key] = st
	}
	return out
}

// Rebuilding from PostgreSQL into a fresh bucket gives, task by task, the
// state the live projector built from the log.
func TestRebuildFromZeroEqualsTheLiveState(t *testing.T) {
	t.Parallel()
	const tasks, versions = 1000, 100
	e := newEnv(t)
	e.seedLog(tasks, versions)

	live := e.start(projector.Config{})
	deadline := time.Now().Add(3 * time.Minute)
	for {
		done := true
		for _, task := range []string{"task-1", "task-500", "task-1000"} {
			if st, ok := e.state(task); !ok || st.Version != versions {
				done = false
			}
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	live.Stop()
	before := e.snapshot()
	require.Len(t, before, tasks)

	p, err := projector.New(projector.Config{}, projector.Deps{NC: e.ns.Conn(t), Pool: e.db.Pool, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	// While the rebuild scans, a writer keeps committing (as the ingest
	// would: commit, then the log copy). None of it may be lost.
	var last projector.Progress
	var once sync.Once
	writerDone := make(chan struct{})
	const during = 20
	require.NoError(t, p.Rebuild(context.Background(), func(pr projector.Progress) {
		last = pr
		once.Do(func() {
			go func() {
				defer close(writerDone)
				for v := 1; v <= during; v++ {
					for _, c := range e.commit(2, "during-rebuild", []string{"step"}, []string{fmt.Sprintf(`{"v":%d}`, v)}) {
						e.publishLog(c)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
		})
	}))
	require.EqualValues(t, tasks*versions, last.Total)
	require.GreaterOrEqual(t, last.Done, int64(tasks*versions))

	after := e.snapshot()
	for task, want := range before {
		got := after[task]
		require.Equal(t, want.Version, got.Version, task)
		require.EqualValues(t, versions, got.Version, task)
		require.Equal(t, want.Status, got.Status, task)
		require.Equal(t, want.Seq, got.Seq, task)
		require.Equal(t, want.Partition, got.Partition, task)
		require.JSONEq(t, string(want.Data), string(got.Data), task)
		require.Nil(t, got.Gap, task)
	}

	// Live consumption resumes after the rebuild: what was committed during
	// the scan, and a new event, are projected.
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(p.Stop)
	<-writerDone
	st := e.waitState("during-rebuild", 20*time.Second, func(s projection.State) bool { return s.Version == during })
	require.JSONEq(t, fmt.Sprintf(`{"v":%d}`, during), string(st.Data))
	next := e.commit(1, "task-1", []string{"reopened"}, []string{`{"again":true}`})
	e.publishLog(next[0])
	st = e.waitState("task-1", 10*time.Second, func(s projection.State) bool { return s.Version == versions+1 })
	var data map[string]any
	require.NoError(t, json.Unmarshal(st.Data, &data))
	require.Equal(t, true, data["again"])
}
