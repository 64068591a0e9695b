package deploytest

import (
	"context"
	"errors"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/migrations"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// beforeDatabaseFence is the schema version before the database held the
// fence itself (migration 00012): the negative control migrates down to it.
const beforeDatabaseFence = 11

// fenceAttack is something a stolen ingest DATABASE_URL could try: a
// statement run as a LOGIN user in ledger_ingest, the SQLSTATE the
// database refuses it with, and a query that is true once it did harm.
type fenceAttack struct {
	name, sql string
	code      string // "" where the attack is not an error but is made harmless
	harm      string
}

// The attacks of issue 23 against the state stageIngestHistory leaves:
// task report-7 at version 2 on partition 1 (by reports.a at generation
// 1), partition 1 now held by reports.b at generation 3, partition 2
// released by reports.a.
var fenceAttacks = []fenceAttack{
	{
		name: "a second version 2 under a stale generation",
		sql: `INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
			VALUES ('01JD00000000000000000000X2', 1, 'report-7', 2, 'completed', '{"by":"billing"}', 'reports.a', 1, clock_timestamp())`,
		code: "LF001",
		harm: `SELECT count(*) = 2 FROM ledger.events WHERE task_id = 'report-7' AND version = 2`,
	},
	{
		name: "a second version 2 under the current lease",
		sql: `INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
			VALUES ('01JD00000000000000000000X3', 1, 'report-7', 2, 'completed', '{"by":"billing"}', 'reports.b', 3, clock_timestamp())`,
		code: "LF005",
		harm: `SELECT count(*) = 2 FROM ledger.events WHERE task_id = 'report-7' AND version = 2`,
	},
	{
		name: "a version 3 under the current lease that its task's head does not cover",
		sql: `INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
			VALUES ('01JD00000000000000000000X4', 1, 'report-7', 3, 'completed', '{"by":"billing"}', 'reports.b', 3, clock_timestamp())`,
		code: "LF005",
		harm: `SELECT count(*) = 1 FROM ledger.events WHERE task_id = 'report-7' AND version = 3`,
	},
	{
		name: "rewinds a lease from generation 3 to 1",
		sql:  `UPDATE ledger.leases SET holder = 'reports.a', generation = 1 WHERE partition = 1`,
		code: "LF006",
		harm: `SELECT generation = 1 FROM ledger.leases WHERE partition = 1`,
	},
	{
		name: "takes over a lease that has not expired",
		sql:  `UPDATE ledger.leases SET holder = 'billing.x', generation = generation + 1 WHERE partition = 1`,
		code: "LF006",
		harm: `SELECT holder = 'billing.x' FROM ledger.leases WHERE partition = 1`,
	},
	{
		name: "extends a lease that was released",
		sql:  `UPDATE ledger.leases SET expires_at = clock_timestamp() + interval '1 hour' WHERE partition = 2`,
		code: "LF006",
		harm: `SELECT expires_at > clock_timestamp() FROM ledger.leases WHERE partition = 2`,
	},
	{
		name: "moves a task's head past versions never committed",
		sql:  `UPDATE ledger.heads SET version = 9 WHERE task_id = 'report-7'`,
		code: "LF005",
		harm: `SELECT version = 9 FROM ledger.heads WHERE task_id = 'report-7'`,
	},
	{
		name: "records an event id for another event's row",
		sql:  `INSERT INTO ledger.event_ids (event_id, seq) SELECT '01JD00000000000000000000X5', seq FROM ledger.heads WHERE task_id = 'report-7'`,
		code: "LF005",
		harm: `SELECT EXISTS (SELECT FROM ledger.event_ids WHERE event_id = '01JD00000000000000000000X5')`,
	},
	{
		name: "records a grant no lease made",
		sql:  `INSERT INTO ledger.lease_grants (partition, generation, holder) VALUES (1, 9, 'billing.x')`,
		code: "LF006",
		harm: `SELECT EXISTS (SELECT FROM ledger.lease_grants WHERE partition = 1 AND generation = 9)`,
	},
	{
		name: "creates 42 partition tables through ensure_partitions",
		sql:  `SELECT ledger.ensure_partitions(42 * (SELECT rows_per_partition FROM ledger.partitioning))`,
		harm: `SELECT count(*) >= 42 FROM ledger.event_partitions`, // 2 or 3 before the attack
	},
}

// stageIngestHistory writes, through the real fence.Store as the ingest's
// user, the history the attacks act on.
func stageIngestHistory(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	store, err := fence.New(pool, fence.Config{})
	require.NoError(t, err)
	a, err := store.Acquire(ctx, 1, "reports.a", time.Minute)
	require.NoError(t, err)
	ev := func(id string, version int64) fence.Event {
		return fence.Event{ID: id, Partition: 1, Task: "report-7", Version: version, Type: "running",
			Payload: []byte(`{"by":"reports"}`), Holder: "reports.a", Generation: a.Generation}
	}
	res, err := store.Append(ctx, []fence.Event{ev("01JD0000000000000000000001", 1), ev("01JD0000000000000000000002", 2)})
	require.NoError(t, err)
	for _, r := range res {
		require.Equal(t, wire.VerdictCommitted, r.Verdict, r.Reason)
	}
	require.NoError(t, store.Release(ctx, 1, "reports.a", a.Generation))
	b, err := store.TakeOver(ctx, 1, "billing.x", a.Generation, time.Minute)
	require.NoError(t, err)
	require.NoError(t, store.Release(ctx, 1, "billing.x", b.Generation))
	c, err := store.TakeOver(ctx, 1, "reports.b", b.Generation, time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 3, c.Generation)

	p2, err := store.Acquire(ctx, 2, "reports.a", time.Minute)
	require.NoError(t, err)
	require.NoError(t, store.Release(ctx, 2, "reports.a", p2.Generation))
}

// runAttack runs one attack as the ingest's user in a transaction that is
// rolled back, and returns its error and whether it did its harm.
func runAttack(t *testing.T, pool *pgxpool.Pool, a fenceAttack) (error, bool) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, "SAVEPOINT attack")
	require.NoError(t, err)
	_, attackErr := tx.Exec(ctx, a.sql)
	if attackErr != nil {
		_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT attack")
		require.NoError(t, err)
	}
	var harmed bool
	require.NoError(t, tx.QueryRow(ctx, a.harm).Scan(&harmed))
	return attackErr, harmed
}

// The ingest's own database role cannot write what the fence refuses: run
// as a LOGIN user in ledger_ingest, each attack of issue 23 is refused by
// the database (or, for ensure_partitions, does nothing), while the same
// user's real appends and lease moves pass (TestIngestUserRunsTheFence).
// The negative control undoes migration 00012 on a second database: every
// attack then does its harm.
func TestIngestRoleCannotBypassTheFence(t *testing.T) {
	t.Parallel()
	fenced := dbtest.New(t)
	unfenced := dbtest.New(t)

	for _, c := range []struct {
		name   string
		db     *dbtest.DB
		fenced bool
	}{{"with the database fence", fenced, true}, {"without it", unfenced, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := openPool(t, loginUser(t, c.db, roleIngest))
			stageIngestHistory(t, pool)
			if !c.fenced {
				// After the history: the fence.Store of today needs the
				// later migrations' columns, the raw attacks do not.
				migrateDown(t, c.db.Pool, beforeDatabaseFence)
			}
			for _, a := range fenceAttacks {
				err, harmed := runAttack(t, pool, a)
				if !c.fenced {
					require.NoErrorf(t, err, "%s: the attack runs without the database fence", a.name)
					require.Truef(t, harmed, "%s: the attack does its harm without the database fence", a.name)
					continue
				}
				require.Falsef(t, harmed, "%s: the attack did its harm", a.name)
				if a.code == "" {
					require.NoErrorf(t, err, "%s", a.name)
					continue
				}
				var pgErr *pgconn.PgError
				require.Truef(t, errors.As(err, &pgErr), "%s: want SQLSTATE %s, got %v", a.name, a.code, err)
				require.Equalf(t, a.code, pgErr.Code, "%s: %s", a.name, pgErr.Message)
			}
		})
	}
}

// The partitions of ledger.events are not the ingest's to write: a row
// inserted into one directly, past the fence on the parent, is refused.
func TestIngestRoleCannotWriteAPartitionDirectly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	var name string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT name FROM ledger.event_partitions ORDER BY lo DESC LIMIT 1`).Scan(&name))
	err := asRole(t, db.Pool, roleIngest, `INSERT INTO ledger.`+name+` (seq, event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
		SELECT lo, '01JD00000000000000000000X6', 1, 'report-8', 1, 'running', '{}', 'reports.a', 1, clock_timestamp()
		FROM ledger.event_partitions WHERE name = '`+name+`'`)
	var pgErr *pgconn.PgError
	require.Truef(t, errors.As(err, &pgErr), "want insufficient_privilege, got %v", err)
	require.Equal(t, sqlInsufficientPrivilege, pgErr.Code, pgErr.Message)
}

// migrateDown undoes migrations as the owner until the schema is at
// version: each later file's "-- +goose Down" half, newest first, and its
// row in the version table.
func migrateDown(t *testing.T, pool *pgxpool.Pool, version int64) {
	t.Helper()
	ctx := context.Background()
	names, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	for _, n := range names {
		v, err := strconv.ParseInt(n[:strings.IndexByte(n, '_')], 10, 64)
		require.NoError(t, err, n)
		if v <= version {
			continue
		}
		b, err := fs.ReadFile(migrations.FS(), n)
		require.NoError(t, err)
		_, down, ok := strings.Cut(string(b), "-- +goose Down")
		require.True(t, ok, "%s has no Down half", n)
		_, err = pool.Exec(ctx, down)
		require.NoError(t, err, n)
		_, err = pool.Exec(ctx, `DELETE FROM `+migrations.VersionTable+` WHERE version_id = $1`, v)
		require.NoError(t, err, n)
	}
}

// The database's fence locks the lease an event claims until commit, also
// for an insert that did not lock it first as the append does: a takeover
// (FOR UPDATE) waits for it.
func TestDatabaseFenceLocksTheLeaseOfARawInsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	pool := openPool(t, loginUser(t, db, roleIngest))
	stageIngestHistory(t, pool)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `WITH ins AS (
		INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
		VALUES ('01JD00000000000000000000L3', 1, 'report-7', 3, 'completed', '{}', 'reports.b', 3, clock_timestamp())
		RETURNING seq, version, type)
		UPDATE ledger.heads h SET version = ins.version, seq = ins.seq, type = ins.type FROM ins WHERE h.task_id = 'report-7'`)
	require.NoError(t, err, "the current holder's next version passes the fence")

	_, err = db.Pool.Exec(ctx, `SELECT FROM ledger.leases WHERE partition = 1 FOR UPDATE NOWAIT`)
	var pgErr *pgconn.PgError
	require.Truef(t, errors.As(err, &pgErr), "a takeover's lock must wait for the insert, got %v", err)
	require.Equal(t, "55P03", pgErr.Code, pgErr.Message) // lock_not_available
	_, err = db.Pool.Exec(ctx, `SELECT FROM ledger.leases WHERE partition = 2 FOR UPDATE NOWAIT`)
	require.NoError(t, err, "a lease the insert does not claim is not locked")
}

// The append writes where a head moved from itself (migration 00020), but
// what it writes does not decide what the database's fence checks: a
// statement that names a wrong moved_from still gets the head's old version.
// A raw insert of version 4 that claims the head moved from 3 is refused as
// the skip past version 3 that it is. The negative control drops the row
// trigger that corrects moved_from: the skip then commits.
func TestAForgedMovedFromSkipsNoVersion(t *testing.T) {
	t.Parallel()
	const attack = `WITH ins AS (
		INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
		VALUES ('01JD00000000000000000000M4', 1, 'report-7', 4, 'completed', '{}', 'reports.b', 3, clock_timestamp())
		RETURNING seq, version, type)
		UPDATE ledger.heads h SET version = ins.version, seq = ins.seq, type = ins.type, moved_from = 3
		FROM ins WHERE h.task_id = 'report-7'`
	const harm = `SELECT count(*) = 1 FROM ledger.events WHERE task_id = 'report-7' AND version = 4`
	for _, corrected := range []bool{true, false} {
		t.Run(map[bool]string{true: "with the row trigger", false: "without it"}[corrected], func(t *testing.T) {
			t.Parallel()
			db := dbtest.New(t)
			pool := openPool(t, loginUser(t, db, roleIngest))
			stageIngestHistory(t, pool)
			if !corrected {
				_, err := db.Pool.Exec(context.Background(), `DROP TRIGGER heads_moved_from_update ON ledger.heads`)
				require.NoError(t, err)
			}
			err, harmed := runAttack(t, pool, fenceAttack{name: "forged moved_from", sql: attack, harm: harm})
			if !corrected {
				require.NoError(t, err, "the skip commits when moved_from is what the statement says")
				require.True(t, harmed)
				return
			}
			var pgErr *pgconn.PgError
			require.Truef(t, errors.As(err, &pgErr), "want SQLSTATE LF005, got %v", err)
			require.Equal(t, "LF005", pgErr.Code, pgErr.Message)
			require.False(t, harmed)
		})
	}
}

// As a user in ledger_ingest, the ingest grants a partition that was
// leased and released before to a new holder, at the next generation. An
// acquire first tries to insert the lease row, ON CONFLICT DO NOTHING, and
// the database's fence checked that insert before PostgreSQL found the
// conflict: every such grant failed with LF006 (migration 00022). The
// negative control puts migration 00012's check back.
func TestIngestRoleGrantsAPartitionLeasedBefore(t *testing.T) {
	t.Parallel()
	for _, fixed := range []bool{true, false} {
		t.Run(map[bool]string{true: "as migrated", false: "with 00012's insert check"}[fixed], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := dbtest.New(t)
			if !fixed {
				migrateDown(t, db.Pool, 21) // 00022 undone
			}
			store, err := fence.New(openPool(t, loginUser(t, db, roleIngest)), fence.Config{})
			require.NoError(t, err)
			a, err := store.Acquire(ctx, 1, "reports.a", time.Minute)
			require.NoError(t, err, "a partition never leased")
			require.NoError(t, store.Release(ctx, 1, "reports.a", a.Generation))
			b, err := store.Acquire(ctx, 1, "billing.x", time.Minute)
			if !fixed {
				var pgErr *pgconn.PgError
				require.Truef(t, errors.As(err, &pgErr), "want LF006, got %v", err)
				require.Equal(t, "LF006", pgErr.Code, pgErr.Message)
				return
			}
			require.NoError(t, err, "a partition leased and released before")
			require.Equal(t, a.Generation+1, b.Generation)
			require.Equal(t, "billing.x", b.Holder)
			_, err = store.Acquire(ctx, 1, "reports.a", time.Minute)
			require.ErrorIs(t, err, fence.ErrHeld, "a lease that has not expired is not granted again")
		})
	}
}
