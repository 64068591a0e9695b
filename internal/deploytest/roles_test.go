package deploytest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
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

const sqlInsufficientPrivilege = pgerrcode.InsufficientPrivilege

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
	_, err = pool.Exec(ctx, `INSERT INTO ledger.heads (task_id, partition, version, seq, type, first_seq)
		SELECT task_id, partition, version, seq, type, seq FROM ledger.events WHERE task_id = 'report-7'`)
	require.NoError(t, err)
}

// TestRolesAllowTheirWorkAndForbidRewritingHistory runs each statement as a
// group role (SET LOCAL ROLE in a transaction that is rolled back) and
// checks it is allowed, or refused with insufficient_privilege.
func TestRolesAllowTheirWorkAndForbidRewritingHistory(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	seed(t, db.Pool)

	// An append moves the task's head in the statement that inserts the
	// event, as the fenced insert does (migration 00012 refuses an event
	// its head does not cover).
	const insertEvent = `WITH ins AS (
		INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
		VALUES ('01JD0000000000000000000002', 3, 'report-7', 2, 'done', '{"ok":true}', 'worker-a', 1, clock_timestamp())
		RETURNING seq, version, type)
		UPDATE ledger.heads h SET version = ins.version, seq = ins.seq, type = ins.type FROM ins WHERE h.task_id = 'report-7'`
	cases := []struct {
		role, name, sql string
		allowed         bool
	}{
		{roleIngest, "appends an event", insertEvent, true},
		{roleIngest, "reads events", `SELECT count(*) FROM ledger.events`, true},
		{roleIngest, "records a rejection", `INSERT INTO ledger.rejections (event_id, partition, task_id, version, holder, generation, verdict, reason, current_generation)
			VALUES ('01JD0000000000000000000003', 3, 'report-7', 2, 'worker-b', 1, 'stale', 'not_holder', 1)`, true},
		{roleIngest, "records a grant", `INSERT INTO ledger.lease_grants (partition, generation, holder) VALUES (3, 1, 'worker-a')`, true},
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
		{roleOperator, "revokes a lease", `SELECT * FROM ledger.revoke_lease(3, 0, 'ops', 'drill')`, true},
		{roleOperator, "cordons a partition", `SELECT * FROM ledger.cordon_partition(3, true, 'ops', 'drill')`, true},
		{roleOperator, "reads the operator actions", `SELECT * FROM ledger.lease_actions, ledger.partition_controls`, true},
		{roleOperator, "cannot move a lease itself", `UPDATE ledger.leases SET generation = 9`, false},
		{roleOperator, "cannot forge an action", `INSERT INTO ledger.lease_actions (partition, action, by_name, reason)
			VALUES (3, 'revoke', 'x', 'y')`, false},
		{roleOperator, "switches a fence mode", `SELECT * FROM ledger.set_fence_mode(3, 'observe', 'ops', 'drill')`, true},
		{roleOperator, "cannot set a mode itself", `INSERT INTO ledger.fence_modes VALUES (3, 'observe', 'x', 'y', now())`, false},
		{roleIngest, "reads the fence modes", `SELECT * FROM ledger.fence_modes`, true},
		{roleIngest, "cannot switch a fence mode", `SELECT * FROM ledger.set_fence_mode(3, 'observe', 'ops', 'drill')`, false},
		{roleIngest, "cannot revoke", `SELECT * FROM ledger.revoke_lease(3, 0, 'ops', 'drill')`, false},
		{roleProjector, "cannot cordon", `SELECT * FROM ledger.cordon_partition(3, true, 'ops', 'drill')`, false},
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
	return urlAs(t, db.URL, newLoginRole(t, group))
}

// newLoginRole creates a LOGIN role, in the group roles given, and drops it
// when the test ends. Make it before any database it will own, so that the
// database is dropped first.
func newLoginRole(t *testing.T, groups ...string) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "deploytest_" + strings.Join(append(groups, "user"), "_") + "_" + hex.EncodeToString(b)
	sql := "CREATE ROLE " + pgx.Identifier{name}.Sanitize() + " LOGIN"
	if len(groups) > 0 {
		ids := make([]string, len(groups))
		for i, g := range groups {
			ids[i] = pgx.Identifier{g}.Sanitize()
		}
		sql += " IN ROLE " + strings.Join(ids, ", ")
	}
	_, err := openPool(t, dbtest.ServerURL()).Exec(context.Background(), sql)
	require.NoError(t, err)
	t.Cleanup(func() { dropRole(name) })
	return name
}

// urlAs is dbURL with user as its user.
func urlAs(t *testing.T, dbURL, user string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(user)
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
	stale.ID, stale.Version, stale.Holder = "01JD0000000000000000000002", 2, "worker-a.2"
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
	owner := newLoginRole(t) // before the database it owns: dropped after it
	_, err := openPool(t, dbtest.ServerURL()).Exec(ctx, "ALTER ROLE "+pgx.Identifier{owner}.Sanitize()+" NOCREATEROLE")
	require.NoError(t, err)
	dbURL := dbtest.NewEmpty(t)
	admin := openPool(t, dbURL) // the administrator, connected to the ledger's database
	_, err = admin.Exec(ctx, readRepoFile(t, "deploy/postgres/roles.sql"))
	require.NoError(t, err)
	cfg, err := pgconn.ParseConfig(dbURL)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{cfg.Database}.Sanitize()+" OWNER TO "+pgx.Identifier{owner}.Sanitize())
	require.NoError(t, err)

	pool := openPool(t, urlAs(t, dbURL, owner))
	_, err = migrations.Up(ctx, pool, nil)
	require.NoError(t, err)

	var ok bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT has_table_privilege('ledger_ingest', 'ledger.events', 'INSERT')
		AND NOT has_table_privilege('ledger_ingest', 'ledger.events', 'DELETE')
		AND has_table_privilege('ledger_projector', 'ledger.events', 'SELECT')`).Scan(&ok))
	require.True(t, ok, "the owner's migration granted the roles their privileges")
}

// TestRolesScriptMatchesTheMigration keeps deploy/postgres/roles.sql in step
// with the migrations: the same roles as 00002_roles.sql, the same CONNECT
// statements as 00004_connect.sql, and safe to run twice.
func TestRolesScriptMatchesTheMigration(t *testing.T) {
	t.Parallel()
	createRole := regexp.MustCompile(`(?m)^\s*CREATE ROLE (\w+) NOLOGIN;`)
	connect := regexp.MustCompile(`(?m)^\s*EXECUTE format\('((?:GRANT|REVOKE) CONNECT ON DATABASE %I (?:TO|FROM) [^']+)', db\);`)
	find := func(re *regexp.Regexp, src string) []string {
		var out []string
		for _, m := range re.FindAllStringSubmatch(src, -1) {
			out = append(out, m[1])
		}
		slices.Sort(out)
		return out
	}
	script := readRepoFile(t, "deploy/postgres/roles.sql")
	want := []string{roleIngest, roleOperator, roleProjector}
	require.Equal(t, want, find(createRole, script))
	require.Equal(t, want, find(createRole, readRepoFile(t, "migrations/00002_roles.sql")))

	connects := find(connect, readRepoFile(t, "migrations/00004_connect.sql"))
	require.Equal(t, []string{
		"REVOKE CONNECT ON DATABASE %I FROM PUBLIC",
		"REVOKE CONNECT ON DATABASE %I FROM ledger_ingest, ledger_projector, ledger_operator",
	}, connects)
	require.Equal(t, connects, find(connect, script))

	// In a database of its own: the script changes who may connect to the
	// database it runs in.
	admin := openPool(t, dbtest.NewEmpty(t))
	for range 2 {
		_, err := admin.Exec(context.Background(), script)
		require.NoError(t, err)
	}
}

// pgConnectAs opens one connection to dbURL as user and runs a query, and
// returns the error if either fails.
func pgConnectAs(t *testing.T, dbURL, user string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, urlAs(t, dbURL, user))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT 1")
	return err
}

// requireNoConnect checks that user is refused at the door of dbURL for
// want of the CONNECT privilege.
func requireNoConnect(t *testing.T, dbURL, user, why string) {
	t.Helper()
	err := pgConnectAs(t, dbURL, user)
	var pgErr *pgconn.PgError
	require.Truef(t, errors.As(err, &pgErr), "%s: want insufficient_privilege, got %v", why, err)
	require.Equalf(t, sqlInsufficientPrivilege, pgErr.Code, "%s: %s", why, pgErr.Message)
}

// migratedDatabase is a fresh database migrated by the server's admin
// user, as a deployment's owner would (dbtest.New copies a template, and a
// copy does not keep the template's database privileges).
func migratedDatabase(t *testing.T) string {
	t.Helper()
	dbURL := dbtest.NewEmpty(t)
	_, err := migrations.Up(context.Background(), openPool(t, dbURL), nil)
	require.NoError(t, err)
	return dbURL
}

// The ledger's database admits its owner and the LOGIN users it was told
// of by name (GRANT CONNECT, as docs/operations.md says to do with each
// user), and nobody else: not the server's other users, and not another
// ledger's services, although they are members of the same server-wide
// group roles. Two ledgers on one server, each migrated as shipped.
func TestOnlyTheLedgersRolesConnect(t *testing.T) {
	t.Parallel()
	ingestA, ingestB := newLoginRole(t, roleIngest), newLoginRole(t, roleIngest)
	projector, operator := newLoginRole(t, roleProjector), newLoginRole(t, roleOperator)
	outsider := newLoginRole(t) // another application's user on the same server
	ledgerA, ledgerB := migratedDatabase(t), migratedDatabase(t)
	grantConnect(t, ledgerA, ingestA, projector, operator)
	grantConnect(t, ledgerB, ingestB)

	for _, user := range []string{ingestA, projector, operator} {
		require.NoErrorf(t, pgConnectAs(t, ledgerA, user), "%s reaches its ledger", user)
	}
	require.NoError(t, pgConnectAs(t, ledgerB, ingestB), "ledger B's ingest reaches ledger B")
	requireNoConnect(t, ledgerA, outsider, "a user outside the ledger's roles")
	requireNoConnect(t, ledgerB, outsider, "a user outside the ledger's roles at ledger B")
	requireNoConnect(t, ledgerB, ingestA, "ledger A's ingest at ledger B")
	requireNoConnect(t, ledgerA, ingestB, "ledger B's ingest at ledger A")
	requireNoConnect(t, ledgerB, projector, "ledger A's projector at ledger B")
	requireNoConnect(t, ledgerB, operator, "ledger A's operator at ledger B")
}

// grantConnect grants CONNECT on dbURL's database to users, as its owner.
func grantConnect(t *testing.T, dbURL string, users ...string) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dbURL)
	require.NoError(t, err)
	ids := make([]string, len(users))
	for i, u := range users {
		ids[i] = pgx.Identifier{u}.Sanitize()
	}
	_, err = openPool(t, dbURL).Exec(context.Background(),
		"GRANT CONNECT ON DATABASE "+pgx.Identifier{cfg.Database}.Sanitize()+" TO "+strings.Join(ids, ", "))
	require.NoError(t, err)
}

// Migrations run as the owner: a service's or an operator's user is
// refused with ErrNotMigrator before anything is applied, even where it
// could have applied them (here it owns the database), since the service
// would then own the history it may only append to.
func TestMigrationsRefuseTheLedgersRoles(t *testing.T) {
	t.Parallel()
	for _, group := range []string{roleIngest, roleProjector, roleOperator} {
		t.Run(group, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			user := newLoginRole(t, group)
			dbURL := dbtest.NewEmpty(t)
			cfg, err := pgconn.ParseConfig(dbURL)
			require.NoError(t, err)
			admin := openPool(t, dbURL)
			_, err = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{cfg.Database}.Sanitize()+" OWNER TO "+pgx.Identifier{user}.Sanitize())
			require.NoError(t, err)

			applied, err := migrations.Up(ctx, openPool(t, urlAs(t, dbURL, user)), nil)
			require.ErrorIs(t, err, migrations.ErrNotMigrator)
			require.ErrorContains(t, err, user)
			require.ErrorContains(t, err, "is a member of "+group)
			require.ErrorContains(t, err, "-migrate=false")
			require.Empty(t, applied)
			var schema, versions *string
			require.NoError(t, admin.QueryRow(ctx, `SELECT to_regnamespace('ledger')::text, to_regclass('public.ledger_schema_version')::text`).Scan(&schema, &versions))
			require.Nil(t, schema, "nothing was applied")
			require.Nil(t, versions, "nothing was applied")
		})
	}
}

// A pending migration is refused to a role that does not own the ledger
// schema, with the clear error rather than a "permission denied" halfway.
func TestMigrationsRefuseARoleThatDoesNotOwnTheSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stranger := newLoginRole(t)
	db := dbtest.New(t)
	_, err := db.Pool.Exec(ctx, `DELETE FROM public.ledger_schema_version WHERE version_id = (SELECT max(version_id) FROM public.ledger_schema_version)`)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, openPool(t, urlAs(t, db.URL, stranger)), nil)
	require.ErrorIs(t, err, migrations.ErrNotMigrator)
	require.ErrorContains(t, err, "does not own the ledger schema")
	_, err = migrations.Up(ctx, openPool(t, loginUser(t, db, roleIngest)), nil)
	require.ErrorIs(t, err, migrations.ErrNotMigrator, "the ingest's user, with a migration pending")
}

// A migrator that owns the schema but not the database cannot take CONNECT
// from PUBLIC: the migration says so and how to fix it, rather than leave
// the database open with a warning. Once an administrator has run
// deploy/postgres/roles.sql in the database, the same migrator finishes.
func TestMigratorThatDoesNotOwnTheDatabaseNeedsTheRolesScript(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	migrator := newLoginRole(t)
	dbURL := dbtest.NewEmpty(t)
	cfg, err := pgconn.ParseConfig(dbURL)
	require.NoError(t, err)
	db, who := pgx.Identifier{cfg.Database}.Sanitize(), pgx.Identifier{migrator}.Sanitize()
	admin := openPool(t, dbURL)
	_, err = admin.Exec(ctx, "GRANT CREATE ON DATABASE "+db+" TO "+who+"; GRANT CREATE ON SCHEMA public TO "+who)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, openPool(t, urlAs(t, dbURL, migrator)), nil)
	var pgErr *pgconn.PgError
	require.Truef(t, errors.As(err, &pgErr), "want the migration's own error, got %v", err)
	require.Equal(t, sqlInsufficientPrivilege, pgErr.Code)
	require.Contains(t, pgErr.Message, "cannot take CONNECT")
	require.Contains(t, pgErr.Hint, "deploy/postgres/roles.sql")
	require.NoError(t, pgConnectAs(t, dbURL, newLoginRole(t)), "the database is still open to everyone: the migration did not pass")

	_, err = admin.Exec(ctx, readRepoFile(t, "deploy/postgres/roles.sql"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "GRANT CONNECT ON DATABASE "+db+" TO "+who)
	require.NoError(t, err)
	_, err = migrations.Up(ctx, openPool(t, urlAs(t, dbURL, migrator)), nil)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, admin))
}
