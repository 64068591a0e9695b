package deploytest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/migrations"
	"github.com/flowness/ledger/pkg/fence"
)

// Group roles of migrations/00002_roles.sql.
const (
	roleIngest    = "ledger_ingest"
	roleProjector = "ledger_projector"
	roleOperator  = "ledger_operator"
)

const sqlInsufficientPrivilege = "42501"

// seed writes one lease and one event as the owner, so that the statements
// under test have rows to act on.
func seed(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO ledger.leases (partition, holder, generation, expires_at, ttl_ms)
		VALUES (3, 'worker-a', 1, clock_timestamp() + interval '1 hour', 3000)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
		VALUES ('01JD0000000000000000000001', 3, 'report-7', 1, 'running', '{}', 'worker-a', 1, clock_timestamp())`)
	require.NoError(t, err)
}

// TestRolesAllowTheirWorkAndForbidRewritingHistory runs each statement as a
// group role (SET LOCAL ROLE in a transaction that is rolled back) and
// checks it is allowed, or refused with insufficient_privilege.
func TestRolesAllowTheirWorkAndForbidRewritingHistory(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	seed(t, db.Pool)

	const insertEvent = `INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
		VALUES ('01JD0000000000000000000002', 3, 'report-7', 2, 'done', '{"ok":true}', 'worker-a', 1, clock_timestamp())`
	cases := []struct {
		role, name, sql string
		allowed         bool
	}{
		{roleIngest, "appends an event", insertEvent, true},
		{roleIngest, "reads events", `SELECT count(*) FROM ledger.events`, true},
		{roleIngest, "records a rejection", `INSERT INTO ledger.rejections (event_id, partition, task_id, version, holder, generation, verdict, reason)
			VALUES ('01JD0000000000000000000003', 3, 'report-7', 2, 'worker-b', 1, 'stale', 'not_holder')`, true},
		{roleIngest, "records a grant", `INSERT INTO ledger.lease_grants (partition, generation, holder) VALUES (3, 2, 'worker-b')`, true},
		{roleIngest, "grants a first lease", `INSERT INTO ledger.leases (partition, holder, generation, expires_at, ttl_ms)
			VALUES (4, 'worker-a', 1, clock_timestamp(), 3000)`, true},
		{roleIngest, "moves a lease", `UPDATE ledger.leases SET generation = generation + 1 WHERE partition = 3`, true},
		{roleIngest, "locks leases for an append", `SELECT * FROM ledger.leases WHERE partition = 3 FOR SHARE`, true},
		{roleIngest, "cannot delete events", `DELETE FROM ledger.events`, false},
		{roleIngest, "cannot truncate events", `TRUNCATE ledger.events`, false},
		{roleIngest, "cannot rewrite an event", `UPDATE ledger.events SET payload = '{}'`, false},
		{roleIngest, "cannot delete rejections", `DELETE FROM ledger.rejections`, false},
		{roleIngest, "cannot rewrite grants", `UPDATE ledger.lease_grants SET holder = 'x'`, false},
		{roleIngest, "cannot truncate grants", `TRUNCATE ledger.lease_grants`, false},
		{roleIngest, "cannot delete leases", `DELETE FROM ledger.leases`, false},
		{roleIngest, "cannot drop the log", `DROP TABLE ledger.events`, false},
		{roleIngest, "cannot change the schema", `CREATE TABLE ledger.scratch (id int)`, false},
		{roleIngest, "cannot record a migration", `INSERT INTO public.ledger_schema_version (version_id, is_applied) VALUES (99, true)`, false},

		{roleProjector, "reads events", `SELECT * FROM ledger.events WHERE task_id = 'report-7' ORDER BY version`, true},
		{roleProjector, "reads leases", `SELECT * FROM ledger.leases`, true},
		{roleProjector, "reads the schema version", `SELECT max(version_id) FROM public.ledger_schema_version`, true},
		{roleProjector, "cannot append", insertEvent, false},
		{roleProjector, "cannot move a lease", `UPDATE ledger.leases SET generation = 9`, false},
		{roleProjector, "cannot lock leases", `SELECT * FROM ledger.leases FOR SHARE`, false},
		{roleProjector, "cannot delete events", `DELETE FROM ledger.events`, false},

		{roleOperator, "reads rejections", `SELECT verdict, reason, count(*) FROM ledger.rejections GROUP BY 1, 2`, true},
		{roleOperator, "reads grants", `SELECT * FROM ledger.lease_grants`, true},
		{roleOperator, "cannot append", insertEvent, false},
		{roleOperator, "cannot truncate events", `TRUNCATE ledger.events`, false},
	}
	for _, tc := range cases {
		t.Run(tc.role+" "+tc.name, func(t *testing.T) {
			t.Parallel()
			err := asRole(t, db.Pool, tc.role, tc.sql)
			if tc.allowed {
				require.NoError(t, err)
				return
			}
			var pgErr *pgconn.PgError
			require.Truef(t, errors.As(err, &pgErr), "want insufficient_privilege, got %v", err)
			require.Equal(t, sqlInsufficientPrivilege, pgErr.Code, pgErr.Message)
		})
	}
}

// asRole runs sql as role in a transaction that is always rolled back.
func asRole(t *testing.T, pool *pgxpool.Pool, role, sql string) error {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, sql)
	return err
}

// loginUser creates a LOGIN user in group, as docs/operations.md tells an
// operator to, and returns a URL that connects to db as that user. The user
// is dropped when the test ends.
func loginUser(t *testing.T, db *dbtest.DB, group string) string {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "deploytest_" + group + "_" + hex.EncodeToString(b)
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{name}.Sanitize()+" LOGIN IN ROLE "+pgx.Identifier{group}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() { dropRole(name) })
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.User = url.User(name)
	return u.String()
}

// dropRole drops a role made by a test; its connections must be closed.
func dropRole(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbtest.ServerURL())
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
}

func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestIngestUserRunsTheFence drives the real fence.Store through a LOGIN
// user in ledger_ingest: every lease operation and every kind of append
// outcome the ingest writes, and the migration steps the ingest runs at
// start.
func TestIngestUserRunsTheFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	// A hardened deployment takes EXECUTE on functions away from PUBLIC;
	// the fenced insert's ledger.fence_check must still be callable.
	_, err := db.Pool.Exec(ctx, `REVOKE EXECUTE ON FUNCTION ledger.fence_check(bigint, bigint) FROM PUBLIC`)
	require.NoError(t, err)
	pool := openPool(t, loginUser(t, db, roleIngest))

	applied, err := migrations.Up(ctx, pool, nil)
	require.NoError(t, err, "-migrate (the default) must be a no-op for the ingest user once the owner migrated")
	require.Empty(t, applied)
	require.NoError(t, migrations.Check(ctx, pool), "the readiness check reads the schema version")

	store, err := fence.New(pool, fence.Config{})
	require.NoError(t, err)
	lease, err := store.Acquire(ctx, 3, "worker-a.1", time.Minute)
	require.NoError(t, err)
	_, err = store.Renew(ctx, 3, "worker-a.1", lease.Generation, time.Minute)
	require.NoError(t, err)

	ev := fence.Event{ID: "01JD0000000000000000000001", Partition: 3, Task: "report-7", Version: 1,
		Type: "running", Payload: []byte(`{"status":"running"}`), Holder: "worker-a.1", Generation: lease.Generation}
	stale := ev
	stale.ID, stale.Version, stale.Holder = "01JD0000000000000000000002", 2, "worker-b.1"
	res, err := store.Append(ctx, []fence.Event{ev, stale})
	require.NoError(t, err)
	require.Equal(t, "committed", string(res[0].Verdict))
	require.Equal(t, "stale", string(res[1].Verdict), "a rejection is recorded")

	res, err = store.Append(ctx, []fence.Event{ev})
	require.NoError(t, err)
	require.Equal(t, "duplicate", string(res[0].Verdict))

	head, err := store.TaskHead(ctx, "report-7")
	require.NoError(t, err)
	require.EqualValues(t, 1, head.Version)

	require.NoError(t, store.Release(ctx, 3, "worker-a.1", lease.Generation))
	taken, err := store.TakeOver(ctx, 3, "worker-b.1", lease.Generation, time.Minute)
	require.NoError(t, err)
	require.Equal(t, lease.Generation+1, taken.Generation)
	leases, err := store.Leases(ctx)
	require.NoError(t, err)
	require.Len(t, leases, 1)
}

func TestProjectorUserReadsButCannotWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	seed(t, db.Pool)
	pool := openPool(t, loginUser(t, db, roleProjector))

	require.NoError(t, migrations.Check(ctx, pool), "the projector checks the schema version at start")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM ledger.events WHERE task_id = 'report-7'`).Scan(&n))
	require.Equal(t, 1, n)

	store, err := fence.New(pool, fence.Config{})
	require.NoError(t, err)
	_, err = store.Acquire(ctx, 5, "worker-a.1", time.Minute)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, sqlInsufficientPrivilege, pgErr.Code)
}

// TestOwnerWithoutCreateRoleCanMigrate is the managed-database path of
// docs/operations.md: an administrator runs deploy/postgres/roles.sql, and
// the database's owner, who may not create roles, applies the migrations.
func TestOwnerWithoutCreateRoleCanMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := openPool(t, dbtest.ServerURL())
	_, err := admin.Exec(ctx, readRepoFile(t, "deploy/postgres/roles.sql"))
	require.NoError(t, err)

	b := make([]byte, 6)
	_, _ = rand.Read(b)
	owner := "deploytest_owner_" + hex.EncodeToString(b)
	_, err = admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{owner}.Sanitize()+" LOGIN NOCREATEROLE")
	require.NoError(t, err)
	t.Cleanup(func() { dropRole(owner) }) // after the database is dropped
	dbURL := dbtest.NewEmpty(t)
	cfg, err := pgconn.ParseConfig(dbURL)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{cfg.Database}.Sanitize()+" OWNER TO "+pgx.Identifier{owner}.Sanitize())
	require.NoError(t, err)

	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(owner)
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	defer pool.Close()
	_, err = migrations.Up(ctx, pool, nil)
	require.NoError(t, err)

	var ok bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT has_table_privilege('ledger_ingest', 'ledger.events', 'INSERT')
		AND NOT has_table_privilege('ledger_ingest', 'ledger.events', 'DELETE')
		AND has_table_privilege('ledger_projector', 'ledger.events', 'SELECT')`).Scan(&ok))
	require.True(t, ok, "the owner's migration granted the roles their privileges")
}

// TestRolesScriptMatchesTheMigration keeps deploy/postgres/roles.sql and
// migrations/00002_roles.sql creating the same roles, and the script safe
// to run twice.
func TestRolesScriptMatchesTheMigration(t *testing.T) {
	t.Parallel()
	createRole := regexp.MustCompile(`(?m)^\s*CREATE ROLE (\w+) NOLOGIN;`)
	names := func(src string) []string {
		var out []string
		for _, m := range createRole.FindAllStringSubmatch(src, -1) {
			out = append(out, m[1])
		}
		slices.Sort(out)
		return out
	}
	script := readRepoFile(t, "deploy/postgres/roles.sql")
	want := []string{roleIngest, roleOperator, roleProjector}
	require.Equal(t, want, names(script))
	require.Equal(t, want, names(readRepoFile(t, "migrations/00002_roles.sql")))

	admin := openPool(t, dbtest.ServerURL())
	for range 2 {
		_, err := admin.Exec(context.Background(), script)
		require.NoError(t, err)
	}
}
