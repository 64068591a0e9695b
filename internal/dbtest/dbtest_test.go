package dbtest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
)

func TestEachTestGetsItsOwnMigratedDatabase(t *testing.T) {
	t.Parallel()
	a, b := dbtest.New(t), dbtest.New(t)
	require.NotEqual(t, a.Name, b.Name)
	ctx := context.Background()

	_, err := a.Pool.Exec(ctx, `INSERT INTO ledger.leases (partition, holder, generation, expires_at, ttl_ms)
		VALUES (1, 'w', 1, clock_timestamp(), 3000)`)
	require.NoError(t, err)

	var n int
	require.NoError(t, b.Pool.QueryRow(ctx, "SELECT count(*) FROM ledger.leases").Scan(&n))
	require.Equal(t, 0, n, "a row written in one test's database is visible in another's")
	require.NoError(t, a.Pool.QueryRow(ctx, "SELECT count(*) FROM ledger.leases").Scan(&n))
	require.Equal(t, 1, n)
}
