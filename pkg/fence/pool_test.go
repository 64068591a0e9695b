package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
)

func TestConfigurePoolSetsKeepalivesAndIdleTimeout(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, fence.Config{})
	ctx := context.Background()
	show := func(pool *pgxpool.Pool, name string) string {
		var v string
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v))
		return v
	}

	pc, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	fence.ConfigurePool(pc, fence.Config{})
	require.NotNil(t, pc.ConnConfig.DialFunc)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer pool.Close()
	require.Equal(t, "30s", show(pool, "idle_in_transaction_session_timeout"), "default 30 s")
	require.Equal(t, "15", show(pool, "tcp_keepalives_idle"), "default 15 s")
	require.Equal(t, "5", show(pool, "tcp_keepalives_interval"))
	require.Equal(t, "3", show(pool, "tcp_keepalives_count"))

	// What the connection string says wins.
	pc, err = pgxpool.ParseConfig(db.URL + "&idle_in_transaction_session_timeout=7000")
	require.NoError(t, err)
	fence.ConfigurePool(pc, fence.Config{KeepAlive: 6 * time.Second})
	pool2, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer pool2.Close()
	require.Equal(t, "7s", show(pool2, "idle_in_transaction_session_timeout"))
	require.Equal(t, "6", show(pool2, "tcp_keepalives_idle"))
	require.Equal(t, "2", show(pool2, "tcp_keepalives_interval"))
}

// A statement of an append that runs past StatementTimeout is cancelled
// (here a trigger sleeps): the append fails, as transient, instead of
// holding its lease rows for as long as the statement would run.
func TestStatementTimeoutBoundsAnAppend(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{StatementTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
CREATE FUNCTION ledger.test_slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$;
CREATE TRIGGER test_slow BEFORE INSERT ON ledger.events FOR EACH ROW EXECUTE FUNCTION ledger.test_slow();`)
	require.NoError(t, err)
	l, err := s.Acquire(ctx, 0, "worker-a.1", longTTL)
	require.NoError(t, err)
	_, err = s.Append(ctx, []fence.Event{ev(l, "t", 1, "x")})
	require.Error(t, err)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, pgerrcode.QueryCanceled, pgErr.Code)
	require.True(t, fence.IsTransient(err), "a cancelled statement is retried, never a verdict")
	require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.events`))
}
