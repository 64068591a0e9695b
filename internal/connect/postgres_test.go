package connect

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
)

// A PgBouncer as Debian ships it, with the settings this test names.
const ignoreOurParams = "ignore_startup_parameters = extra_float_digits, tcp_keepalives_idle, tcp_keepalives_interval, tcp_keepalives_count, idle_in_transaction_session_timeout"

func setting(t *testing.T, pool *pgxpool.Pool, name string) string {
	t.Helper()
	var v string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT current_setting($1)`, name).Scan(&v))
	return v
}

// hammer runs queries with arguments from many goroutines at once, as the
// ingest's lanes and lease service do, and returns the first error.
func hammer(pool *pgxpool.Pool) error {
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				var n int
				q := fmt.Sprintf("SELECT $1::int + %d", i%5) // five distinct statements
				if err := pool.QueryRow(context.Background(), q, g).Scan(&n); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// The server's own, stricter idle_in_transaction_session_timeout (as a
// provider sets it for a role or database) is kept, not raised to 30 s.
func TestStricterServerIdleTimeoutIsKept(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`ALTER DATABASE %s SET idle_in_transaction_session_timeout = '5s'`,
		pgx.Identifier{db.Name}.Sanitize()))
	require.NoError(t, err)
	o := Options{DatabaseURL: db.URL}
	pool, err := o.Postgres(context.Background())
	require.NoError(t, err)
	defer pool.Close()
	require.Equal(t, "5s", setting(t, pool, "idle_in_transaction_session_timeout"))
	require.Equal(t, 5*time.Second, o.Session.IdleInTransaction)

	// A laxer one gets the ledger's 30 s.
	_, err = db.Pool.Exec(context.Background(), fmt.Sprintf(`ALTER DATABASE %s SET idle_in_transaction_session_timeout = '5min'`,
		pgx.Identifier{db.Name}.Sanitize()))
	require.NoError(t, err)
	o = Options{DatabaseURL: db.URL}
	pool2, err := o.Postgres(context.Background())
	require.NoError(t, err)
	defer pool2.Close()
	require.Equal(t, "30s", setting(t, pool2, "idle_in_transaction_session_timeout"))
	require.False(t, o.Session.Pooled, "a direct connection is not pooled")
	require.False(t, o.Session.Proxied, "a direct connection announces its own process id")
	require.Equal(t, pgx.QueryExecModeCacheStatement, o.Session.ExecMode)
}

// A stock PgBouncer refuses the keepalive and timeout settings a
// connection sends; the pool connects without them and says so.
func TestPoolerRefusingSessionSettingsStillConnects(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	pb := dbtest.StartPgBouncer(t, "session")
	o := Options{DatabaseURL: pb.URL(t, db.Name)}
	pool, err := o.Postgres(context.Background())
	require.NoError(t, err)
	defer pool.Close()
	require.True(t, o.Session.ParamsRefused)
	require.False(t, o.Session.Pooled, "session mode gives each client a session of its own")
	require.True(t, o.Session.Proxied, "PgBouncer announces process ids of its own")
	require.Equal(t, pgx.QueryExecModeCacheDescribe, o.Session.ExecMode, "behind a pooler statements are unnamed")
	require.NoError(t, hammer(pool))
}

// With ignore_startup_parameters the settings vanish silently on the
// server; Postgres notices, and reports the server's own timeout.
func TestPoolerIgnoringSessionSettingsIsNoticed(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	pb := dbtest.StartPgBouncer(t, "session", ignoreOurParams)
	o := Options{DatabaseURL: pb.URL(t, db.Name)}
	pool, err := o.Postgres(context.Background())
	require.NoError(t, err)
	defer pool.Close()
	require.True(t, o.Session.ParamsDropped)
	require.False(t, o.Session.ParamsRefused)
	require.Equal(t, time.Duration(0), o.Session.IdleInTransaction)
}

// Behind a transaction-mode pooler the pool's statements are unnamed, so
// concurrent queries never meet another client's prepared statement.
func TestTransactionPoolerGetsUnnamedStatements(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	pb := dbtest.StartPgBouncer(t, "transaction")
	o := Options{DatabaseURL: pb.URL(t, db.Name)}
	pool, err := o.Postgres(context.Background())
	require.NoError(t, err)
	defer pool.Close()
	require.True(t, o.Session.Pooled)
	require.Equal(t, pgx.QueryExecModeCacheDescribe, o.Session.ExecMode)
	require.NoError(t, hammer(pool))
	require.NoError(t, o.CheckPooler(pool)(context.Background()))
}

// A transaction pooler that hands out its server sessions in turn
// (server_round_robin, or any pooler under load) never shows two probes
// one session; the pool's statements are unnamed all the same, because
// the process id PgBouncer announces is not the session's. Switch:
// probeSessions never reporting proxied.
func TestTransactionPoolerHidingItsSharingGetsUnnamedStatements(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	pb := dbtest.StartPgBouncer(t, "transaction", "server_round_robin = 1")
	url := pb.URL(t, db.Name, "default_query_exec_mode=exec", "pool_max_conns=5")
	// Five server sessions, idle in the pooler's queue: the probes' four
	// queries each get another one.
	warm, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	var held []pgx.Tx
	for range 5 {
		tx, err := warm.Begin(context.Background())
		require.NoError(t, err)
		_, err = tx.Exec(context.Background(), `SELECT 1`)
		require.NoError(t, err)
		held = append(held, tx)
	}
	for _, tx := range held {
		require.NoError(t, tx.Rollback(context.Background()))
	}
	defer warm.Close()

	o := Options{DatabaseURL: pb.URL(t, db.Name)}
	pool, err := o.Postgres(context.Background())
	require.NoError(t, err)
	defer pool.Close()
	require.False(t, o.Session.Pooled, "the probes met no session twice")
	require.True(t, o.Session.Proxied)
	require.Equal(t, pgx.QueryExecModeCacheDescribe, o.Session.ExecMode)
	require.NoError(t, hammer(pool))
	require.NoError(t, o.CheckPooler(pool)(context.Background()))
}

// A URL that asks for named statements behind a transaction pooler is
// refused at start, with the fix in the message.
func TestTransactionPoolerWithNamedStatementsIsRefused(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	pb := dbtest.StartPgBouncer(t, "transaction")
	o := Options{DatabaseURL: pb.URL(t, db.Name, "default_query_exec_mode=cache_statement")}
	_, err := o.Postgres(context.Background())
	require.ErrorIs(t, err, ErrTransactionPooler)
	require.ErrorContains(t, err, "cache_describe")
}

// Readiness fails while a pool that names its statements meets a
// transaction pooler (one that was not there at start, say).
func TestReadinessFailsWhenStatementsClashOnSharedSessions(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	pb := dbtest.StartPgBouncer(t, "transaction")
	o := Options{Session: Session{ExecMode: pgx.QueryExecModeCacheStatement}, clashes: &clashTracer{}}
	cfg, err := pgxpool.ParseConfig(pb.URL(t, db.Name))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = o.clashes
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	require.Error(t, hammer(pool), "named statements clash behind a transaction pooler")
	err = o.CheckPooler(pool)(context.Background())
	require.ErrorIs(t, err, ErrTransactionPooler)
	require.ErrorContains(t, err, "failed on a shared session")

	// Without a clash yet, the shared sessions themselves fail the check.
	o.clashes = &clashTracer{}
	require.ErrorIs(t, o.CheckPooler(pool)(context.Background()), ErrTransactionPooler)
}

func TestRootCertificateNeedsAVerifyingMode(t *testing.T) {
	t.Parallel()
	none := func(string) string { return "" }
	for _, c := range []struct {
		url    string
		env    map[string]string
		refuse bool
	}{
		{url: "postgres://u@h/db?sslrootcert=/ca.pem", refuse: true},
		{url: "postgres://u@h/db?sslrootcert=/ca.pem&sslmode=prefer", refuse: true},
		{url: "postgres://u@h/db?sslrootcert=/ca.pem&sslmode=verify-full"},
		{url: "postgres://u@h/db?sslrootcert=/ca.pem&sslmode=verify-ca"},
		{url: "postgres://u@h/db?sslmode=prefer"},
		{url: "host=h user=u sslrootcert=/ca.pem", refuse: true},
		{url: "host=h user=u sslrootcert=/ca.pem sslmode=verify-full"},
		{url: "postgres://u@h/db", env: map[string]string{"PGSSLROOTCERT": "/ca.pem"}, refuse: true},
		{url: "postgres://u@h/db", env: map[string]string{"PGSSLROOTCERT": "/ca.pem", "PGSSLMODE": "verify-full"}},
	} {
		getenv := none
		if c.env != nil {
			getenv = func(k string) string { return c.env[k] }
		}
		err := checkTLS(c.url, getenv)
		if c.refuse {
			require.ErrorContains(t, err, "sslmode=verify-full", c.url)
		} else {
			require.NoError(t, err, c.url)
		}
	}
}
