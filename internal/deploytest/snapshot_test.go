package deploytest

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// As the ingest's own user, under the database's fence (migration 00012 as
// 00016 amends it), a snapshot task commits versions with holes, in one
// statement and across statements, while an events task still cannot
// skip one; and the ingest's user cannot change a task's kind.
func TestIngestUserCommitsSnapshotTasksUnderTheDatabaseFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	pool := openPool(t, loginUser(t, db, roleIngest))
	store, err := fence.New(pool, fence.Config{})
	require.NoError(t, err)
	l, err := store.Acquire(ctx, 3, "sensors.a", time.Minute)
	require.NoError(t, err)
	snap := func(id string, version int64) fence.Event {
		return fence.Event{ID: id, Partition: 3, Task: "gauge-1", Version: version, Type: "reading",
			Payload: []byte(`{"temp":1}`), Holder: l.Holder, Generation: l.Generation, Snapshot: true}
	}
	res, err := store.Append(ctx, []fence.Event{snap("01JD0000000000000000000S02", 2), snap("01JD0000000000000000000S05", 5)})
	require.NoError(t, err)
	for _, r := range res {
		require.Equal(t, wire.VerdictCommitted, r.Verdict, r.Reason)
	}
	res, err = store.Append(ctx, []fence.Event{snap("01JD0000000000000000000S09", 9)})
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[0].Verdict, res[0].Reason)
	head, err := store.TaskHead(ctx, "gauge-1")
	require.NoError(t, err)
	require.EqualValues(t, 9, head.Version)
	require.Equal(t, wire.KindSnapshot, head.Kind)

	for _, a := range []fenceAttack{
		{
			name: "turns a snapshot task into an events task",
			sql:  `UPDATE ledger.heads SET kind = 'events' WHERE task_id = 'gauge-1'`,
			code: sqlInsufficientPrivilege,
			harm: `SELECT kind = 'events' FROM ledger.heads WHERE task_id = 'gauge-1'`,
		},
		{
			name: "writes a snapshot below its task's head",
			sql: `INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
				VALUES ('01JD00000000000000000000X7', 3, 'gauge-1', 7, 'reading', '{}', 'sensors.a', ` + strconv.FormatInt(l.Generation, 10) + `, clock_timestamp())`,
			code: "LF005",
			harm: `SELECT count(*) = 1 FROM ledger.events WHERE task_id = 'gauge-1' AND version = 7`,
		},
	} {
		err, harmed := runAttack(t, pool, a)
		require.Falsef(t, harmed, "%s: the attack did its harm", a.name)
		var pgErr *pgconn.PgError
		require.Truef(t, errors.As(err, &pgErr), "%s: want SQLSTATE %s, got %v", a.name, a.code, err)
		require.Equalf(t, a.code, pgErr.Code, "%s: %s", a.name, pgErr.Message)
	}
}
