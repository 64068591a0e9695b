package connect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/internal/natstest"
)

// A service started while its database and NATS do not answer yet (a
// restart, a failover, a cut network) waits for them, trying again, and
// connects once they answer. Switch: StartWait 0, the services' behaviour
// before: each fails at once with ErrUnreachable.
func TestAServiceStartedBeforeItsDependenciesWaitsForThem(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ns := natstest.Start(t)
	pgc, err := pgconn.ParseConfig(db.URL)
	require.NoError(t, err)
	pgProxy := faultproxy.Start(t, net.JoinHostPort(pgc.Host, strconv.Itoa(int(pgc.Port))))
	natsProxy := faultproxy.Start(t, strings.TrimPrefix(ns.URL(), "nats://"))
	pgProxy.Cut()
	natsProxy.Cut()
	svc := func(wait time.Duration) *Service {
		return &Service{StartWait: wait, Log: slog.New(slog.DiscardHandler), Conn: Options{
			DatabaseURL: fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgc.User, pgProxy.Addr(), pgc.Database), NATSURL: "nats://" + natsProxy.Addr()}}
	}
	ctx := context.Background()

	_, err = svc(0).Postgres(ctx)
	require.ErrorIs(t, err, ErrUnreachable, "without a wait: at once")
	_, err = svc(0).NATS(ctx)
	require.ErrorIs(t, err, ErrUnreachable, "without a wait: at once")

	time.AfterFunc(1500*time.Millisecond, func() { pgProxy.Restore(); natsProxy.Restore() })
	start := time.Now()
	pool, err := svc(30 * time.Second).Postgres(ctx)
	require.NoError(t, err, "the database answered within the wait")
	defer pool.Close()
	require.NoError(t, pool.Ping(ctx))
	nc, err := svc(30 * time.Second).NATS(ctx)
	require.NoError(t, err, "NATS answered within the wait")
	defer nc.Close()
	require.GreaterOrEqual(t, time.Since(start), time.Second, "the dependencies were down for 1.5 s")
	require.Positive(t, pgProxy.Refused()+natsProxy.Refused(), "the first tries were refused")
}

// The wait is bounded, and a failure that trying again cannot cure (a
// malformed URL) is not waited for.
func TestAServiceGivesUpAfterItsStartWait(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	p := faultproxy.Start(t, strings.TrimPrefix(ns.URL(), "nats://"))
	p.Cut()
	s := &Service{StartWait: time.Second, Log: slog.New(slog.DiscardHandler), Conn: Options{NATSURL: "nats://" + p.Addr()}}
	start := time.Now()
	_, err := s.NATS(context.Background())
	require.ErrorIs(t, err, ErrUnreachable)
	require.Contains(t, err.Error(), "-start-wait")
	require.Less(t, time.Since(start), 10*time.Second)

	s = &Service{StartWait: time.Minute, Conn: Options{DatabaseURL: "postgres://%zz"}}
	start = time.Now()
	_, err = s.Postgres(context.Background())
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrUnreachable), "a malformed URL is no outage: %v", err)
	require.Less(t, time.Since(start), 5*time.Second)
}

// A start step that reads the database (the migrations, the ingest's
// durability check) while the database restarts waits for it, as the
// connection does, and one that fails for a reason retrying cannot cure
// returns at once. Switch: StartWait 0, a step's behaviour before: the
// service ended on the lost connection.
func TestAStartStepWaitsOutADatabaseRestart(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	pgc, err := pgconn.ParseConfig(db.URL)
	require.NoError(t, err)
	proxy := faultproxy.Start(t, net.JoinHostPort(pgc.Host, strconv.Itoa(int(pgc.Port))))
	svc := func(wait time.Duration) *Service {
		return &Service{StartWait: wait, Log: slog.New(slog.DiscardHandler), Conn: Options{
			DatabaseURL: fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgc.User, proxy.Addr(), pgc.Database)}}
	}
	ctx := context.Background()
	pool, err := svc(0).Postgres(ctx)
	require.NoError(t, err)
	defer pool.Close()
	tries := 0
	step := func() error {
		tries++
		_, err := pool.Exec(ctx, `SELECT 1`)
		return err
	}

	proxy.Cut()
	err = svc(0).WhileStarting(ctx, "PostgreSQL", step)
	require.ErrorIs(t, err, ErrUnreachable, "without a wait: at once")
	require.Equal(t, 1, tries)

	tries = 0
	time.AfterFunc(1500*time.Millisecond, proxy.Restore)
	require.NoError(t, svc(30*time.Second).WhileStarting(ctx, "PostgreSQL", step), "the database answered within the wait")
	require.Greater(t, tries, 1, "the first tries failed")

	tries = 0
	err = svc(30*time.Second).WhileStarting(ctx, "PostgreSQL", func() error {
		tries++
		_, err := pool.Exec(ctx, `SELECT FROM no_such_table`)
		return err
	})
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrUnreachable), "a missing table is no outage: %v", err)
	require.Equal(t, 1, tries)
}
