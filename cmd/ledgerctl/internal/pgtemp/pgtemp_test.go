package pgtemp_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/pgtemp"
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
