package pgtemp_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/pgtemp"
)

func TestThrowawayClusterStartsAnswersAndIsRemoved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgtemp.Start(ctx)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
	require.NoError(t, conn.Close(ctx))

	dir := dirOf(t, c.URL())
	c.Stop()
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "the cluster's directory is removed")
}

func dirOf(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	return cfg.Host
}

func TestImmediateRestartOfADurableClusterKeepsEveryCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgtemp.StartWith(ctx, pgtemp.Options{Durable: true})
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE told (n int)")
	require.NoError(t, err)
	// Each insert is its own transaction, committed and answered: a client
	// was told about every one.
	const n = 200
	for i := range n {
		_, err := conn.Exec(ctx, "INSERT INTO told VALUES ($1)", i)
		require.NoError(t, err)
	}
	require.NoError(t, c.Restart(ctx))
	_ = conn.Close(ctx)

	conn, err = pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var count int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM told").Scan(&count))
	require.Equal(t, n, count, "every commit a client was told about survives the crash-like restart")
}
