package ctl_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
)

// The database forgot the newest acknowledged commit; the ingest commits
// nothing on it, and a writer's new version 3 waits. ledgerctl restore
// writes version 3 back from LEDGER_LOG with its original seq and id; the
// ingest then commits again, and the waiting other version 3 is a
// conflict, not a second history.
func TestRestoreWritesBackWhatTheDatabaseForgot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	first, err := ingest.New(ingest.Config{}, ingest.Deps{NC: e.ns.Conn(t), Store: e.store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, first.Start(ctx))
	l := e.acquire(1, "worker-a.1")
	for v := int64(1); v <= 3; v++ {
		e.publish(event{partition: 1, task: "t", holder: l.Holder, generation: l.Generation, version: v, typ: "step", payload: `{"v":1}`})
	}
	e.waitCommitted("t", 3)
	e.waitMsgs("LEDGER_LOG", 3)
	first.Stop()
	seq, id := e.forget("t", 3)

	e.withIngest(ingest.Config{})
	e.publish(event{partition: 1, task: "t", holder: l.Holder, generation: l.Generation, version: 3, typ: "step", payload: `{"v":"other"}`})
	time.Sleep(time.Second)
	require.Equal(t, 2, e.count(`SELECT count(*) FROM ledger.events WHERE task_id = 't'`), "nothing commits on a database that forgot")

	dry := e.run("restore", "-dry-run", "-json").ok(t).jsonLines(t)
	require.Len(t, dry, 1)
	require.Equal(t, id, dry[0]["event_id"])
	require.Equal(t, 2, e.count(`SELECT count(*) FROM ledger.events WHERE task_id = 't'`), "a dry run changes nothing")

	out := e.run("restore", "-json").ok(t).jsonLines(t)
	require.Len(t, out, 1)
	require.Equal(t, "restored", out[0]["outcome"])
	var gotSeq int64
	var payload string
	require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT seq, payload::text FROM ledger.events WHERE event_id = $1`, id).Scan(&gotSeq, &payload))
	require.Equal(t, seq, gotSeq, "the original seq")
	require.JSONEq(t, `{"v":1}`, payload)
	require.Eventually(t, func() bool {
		return e.count(`SELECT count(*) FROM ledger.rejections WHERE task_id = 't' AND version = 3 AND reason = 'version_taken'`) == 1
	}, 20*time.Second, 20*time.Millisecond, "the other version 3 is judged against the restored one")
	require.Equal(t, 3, e.count(`SELECT count(*) FROM ledger.events WHERE task_id = 't'`))
	again := e.run("restore", "-json").ok(t).jsonLines(t)
	require.Empty(t, again, "nothing is left to restore")
}

// forget makes the database forget a task's newest version, as a failover
// to a standby that lacked it does: its row, its id and its head's move.
// It returns the version's seq and event id.
func (e *env) forget(task string, version int64) (seq int64, id string) {
	e.t.Helper()
	ctx := context.Background()
	require.NoError(e.t, e.db.Pool.QueryRow(ctx, `SELECT seq, event_id FROM ledger.events WHERE task_id = $1 AND version = $2`,
		task, version).Scan(&seq, &id))
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`DELETE FROM ledger.event_ids WHERE seq = $1`, []any{seq}},
		{`DELETE FROM ledger.events WHERE seq = $1`, []any{seq}},
		{`UPDATE ledger.heads SET version = $1, seq = $2 WHERE task_id = $3`, []any{version - 1, seq - 1, task}},
	} {
		_, err := e.db.Pool.Exec(ctx, q.sql, q.args...)
		require.NoError(e.t, err, q.sql)
	}
	return seq, id
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// Seqs are drawn before commits: a standby promoted from behind can hold a
// commit of a higher seq and lack one of a lower. ledgerctl restore writes
// back that lower one too, not only what lies above the newest seq.
func TestRestoreWritesBackAForgottenCommitBelowTheNewestSeq(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	first, err := ingest.New(ingest.Config{}, ingest.Deps{NC: e.ns.Conn(t), Store: e.store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, first.Start(ctx))
	l := e.acquire(1, "worker-a.1")
	for v := int64(1); v <= 2; v++ {
		e.publish(event{partition: 1, task: "t", holder: l.Holder, generation: l.Generation, version: v, typ: "step", payload: `{"v":1}`})
	}
	e.waitCommitted("t", 2)
	e.publish(event{partition: 1, task: "u", holder: l.Holder, generation: l.Generation, version: 1, typ: "step", payload: `{"v":1}`})
	e.waitCommitted("u", 1)
	e.waitMsgs("LEDGER_LOG", 3)
	first.Stop()
	seq, id := e.forget("t", 2)
	require.Less(t, seq, int64(e.count(`SELECT max(seq)::int FROM ledger.events`)), "the hole is below the newest seq")

	out := e.run("restore", "-json").ok(t).jsonLines(t)
	require.Len(t, out, 1, "only the forgotten commit, not the ones the database holds")
	require.Equal(t, id, out[0]["event_id"])
	require.Equal(t, "restored", out[0]["outcome"])
	require.Equal(t, 1, e.count(`SELECT count(*) FROM ledger.events WHERE event_id = $1 AND seq = $2`, id, seq))
}
