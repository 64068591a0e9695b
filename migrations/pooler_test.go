package migrations_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/migrations"
)

// A migration that fails (here as 00002_roles.sql fails for an owner
// without CREATEROLE) leaves the schema as it was, not half migrated, and
// its error carries PostgreSQL's hint.
func TestFailedMigrationLeavesNothingAppliedAndCarriesTheHint(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmpty(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()
	fsys := fstest.MapFS{
		"00001_first.sql": {Data: []byte("-- +goose Up\nCREATE TABLE first (id int);\n-- +goose Down\nDROP TABLE first;\n")},
		"00002_roles.sql": {Data: []byte(`-- +goose Up
-- +goose StatementBegin
DO $$ BEGIN
    RAISE EXCEPTION 'ledger roles: % cannot create roles', current_user
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Run deploy/postgres/roles.sql as a user with CREATEROLE, then migrate again.';
END $$;
-- +goose StatementEnd
`)},
	}
	_, err = migrations.UpFS(context.Background(), pool, fsys, nil)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Contains(t, pgErr.Hint, "deploy/postgres/roles.sql")
	require.ErrorContains(t, err, "00002_roles.sql")
	require.Contains(t, connect.Explain(err).Error(), "hint: Run deploy/postgres/roles.sql")

	var first, versions bool
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT to_regclass('first') IS NOT NULL, to_regclass('public.ledger_schema_version') IS NOT NULL`).Scan(&first, &versions))
	require.False(t, first, "00001 was rolled back with 00002")
	require.False(t, versions, "no version was recorded")
}

// Migrators started together behind a transaction-mode PgBouncer, where a
// session advisory lock would be taken on one server session and released
// on another, still apply each migration exactly once.
func TestConcurrentUpThroughTransactionPooler(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmpty(t)
	name := url[strings.LastIndexByte(url, '/')+1:]
	if i := strings.IndexByte(name, '?'); i >= 0 {
		name = name[:i]
	}
	pb := dbtest.StartPgBouncer(t, "transaction")
	const starters = 4
	var wg sync.WaitGroup
	applied := make([][]int64, starters)
	errs := make([]error, starters)
	for i := range starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := connect.Options{DatabaseURL: pb.URL(t, name)}
			pool, err := o.Postgres(context.Background())
			if err != nil {
				errs[i] = err
				return
			}
			defer pool.Close()
			applied[i], errs[i] = migrations.Up(context.Background(), pool, nil)
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
}
