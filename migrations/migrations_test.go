package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/migrations"
)

// Several processes starting at once each run Up: one migrates, the others
// wait on the advisory lock, then find nothing left to do.
func TestConcurrentUpIsSafe(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmpty(t)
	ctx := context.Background()

	const starters = 6
	var wg sync.WaitGroup
	applied := make([][]int64, starters)
	errs := make([]error, starters)
	for i := range starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				errs[i] = err
				return
			}
			defer pool.Close()
			applied[i], errs[i] = migrations.Up(ctx, pool, nil)
		}()
	}
	wg.Wait()
	total := 0
	for i := range starters {
		require.NoError(t, errs[i])
		total += len(applied[i])
	}
	files, err := migrations.Count()
	require.NoError(t, err)
	require.Equal(t, files, total, "every migration is applied exactly once across all starters")

	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, migrations.Check(ctx, pool))
	var n int
	// The partitions of ledger.events are tables too; they are counted apart.
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class
		WHERE relnamespace = 'ledger'::regnamespace AND relkind IN ('r', 'p') AND NOT relispartition`).Scan(&n))
	require.Equal(t, 16, n) // 00014: partition_controls, lease_actions; 00015: fence_modes; 00017: partition_ranges, quota_buckets
}

func TestCheckReportsPendingMigrations(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmpty(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()
	require.ErrorIs(t, migrations.Check(context.Background(), pool), migrations.ErrPending)
}
