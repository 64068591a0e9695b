package pgtemp_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/pgtemp"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func exec1(t *testing.T, url, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int64
	require.NoError(t, conn.QueryRow(ctx, sql, args...).Scan(&n))
	return n
}

const sqlTimeline = `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`

// A synchronous standby holds every commit its primary acknowledged; once
// the primary is killed and the standby promoted, the standby writes on a
// new timeline, and the old primary, started again, still on its old one.
func TestSynchronousStandbyPromotedAfterAKillHoldsEveryCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := pgtemp.StartWith(ctx, pgtemp.Options{Durable: true, TCP: true, Port: freePort(t),
		Settings: []string{"synchronous_standby_names=s1"}})
	if errors.Is(err, pgtemp.ErrNotInstalled) {
		t.Skip(err)
	}
	require.NoError(t, err)
	defer p.Stop()
	s, err := p.StartStandby(ctx, pgtemp.Options{Durable: true, Port: freePort(t)}, "s1")
	require.NoError(t, err)
	defer s.Stop()

	require.NoError(t, p.Exec(ctx, `CREATE TABLE t (n int)`, `INSERT INTO t SELECT generate_series(1, 100)`))
	require.NoError(t, p.Kill())
	require.NoError(t, s.Promote(ctx))
	require.Equal(t, int64(100), exec1(t, s.URL(), `SELECT count(*) FROM t`), "every acknowledged row on the promoted standby")
	require.Equal(t, int64(2), exec1(t, s.URL(), sqlTimeline))

	require.NoError(t, p.StartAgain(ctx, "synchronous_standby_names=''"))
	require.NoError(t, p.Exec(ctx, `INSERT INTO t VALUES (101)`), "the old primary comes back writable")
	require.Equal(t, int64(1), exec1(t, p.URL(), sqlTimeline))
}

// A standby that stopped streaming misses what its primary commits
// afterwards: promoted, it has lost that tail.
func TestFrozenStandbyPromotedLosesTheTail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := pgtemp.StartWith(ctx, pgtemp.Options{Durable: true, TCP: true, Port: freePort(t)})
	if errors.Is(err, pgtemp.ErrNotInstalled) {
		t.Skip(err)
	}
	require.NoError(t, err)
	defer p.Stop()
	s, err := p.StartStandby(ctx, pgtemp.Options{Durable: true, Port: freePort(t)}, "s1")
	require.NoError(t, err)
	defer s.Stop()

	require.NoError(t, p.Exec(ctx, `CREATE TABLE t (n int)`, `INSERT INTO t SELECT generate_series(1, 10)`))
	for exec1(t, s.URL(), `SELECT count(*) FROM pg_class WHERE relname = 't'`) == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	for exec1(t, s.URL(), `SELECT count(*) FROM t`) < 10 {
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, s.StopStreaming(ctx))
	for exec1(t, s.URL(), `SELECT count(*) FROM pg_stat_wal_receiver`) > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, p.Exec(ctx, `INSERT INTO t SELECT generate_series(11, 20)`))
	require.NoError(t, p.Kill())
	require.NoError(t, s.Promote(ctx))
	require.Equal(t, int64(10), exec1(t, s.URL(), `SELECT count(*) FROM t`), "the tail after the freeze is lost")
}
