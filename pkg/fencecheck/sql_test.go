package fencecheck_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/fencecheck"
	"github.com/flowness/ledger/pkg/wire"
)

// downstream is a downstream service's own database, with the fence SQL
// applied and a table of its own writes.
func downstream(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	db := dbtest.New(t)
	require.NoError(t, fencecheck.Apply(ctx, db.Pool))
	require.NoError(t, fencecheck.Apply(ctx, db.Pool), "applying twice changes nothing")
	_, err := db.Pool.Exec(ctx, `CREATE TABLE charges (id bigserial PRIMARY KEY, account text, holder text, generation bigint)`)
	require.NoError(t, err)
	return db.Pool
}

func fence(p int, holder string, g int64) wire.Fence {
	return wire.Fence{Partition: p, Holder: holder, Generation: g}
}

// charge writes one charge guarded by f, in one transaction.
func charge(ctx context.Context, pool *pgxpool.Pool, account string, f wire.Fence) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fencecheck.Admit(ctx, tx, "account/"+account, f); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO charges (account, holder, generation) VALUES ($1, $2, $3)`, account, f.Holder, f.Generation)
		return err
	})
}

func charges(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM charges`).Scan(&n))
	return n
}

func TestStaleHoldersLateWriteIsRefusedByTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := downstream(t)
	require.NoError(t, charge(ctx, pool, "acct-1", fence(3, "pay.a", 1)))
	require.NoError(t, charge(ctx, pool, "acct-1", fence(3, "pay.a", 1)), "the same holder again")
	require.NoError(t, charge(ctx, pool, "acct-1", fence(3, "pay.b", 2)), "its successor")

	err := charge(ctx, pool, "acct-1", fence(3, "pay.a", 1))
	require.ErrorIs(t, err, fencecheck.ErrSuperseded)
	var refused *fencecheck.RefusedError
	require.True(t, errors.As(err, &refused))
	require.Equal(t, int64(2), refused.Highest)
	require.Contains(t, refused.Error(), "superseded")
	var pgErr *pgconn.PgError
	require.False(t, errors.As(err, &pgErr), "the SQLSTATE is classified, not passed on")
	require.Equal(t, 3, charges(t, pool), "the refused write left nothing")
}

func TestSameGenerationOfAnotherHolderIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := downstream(t)
	require.NoError(t, charge(ctx, pool, "acct-1", fence(0, "pay.a", 5)))
	require.ErrorIs(t, charge(ctx, pool, "acct-1", fence(0, "pay.b", 5)), fencecheck.ErrHolderMismatch)
}

func TestFencesOfOtherResourcesAndPartitionsDoNotInterfere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := downstream(t)
	require.NoError(t, charge(ctx, pool, "acct-1", fence(1, "pay.a", 9)))
	require.NoError(t, charge(ctx, pool, "acct-2", fence(1, "pay.a", 2)), "another resource")
	require.NoError(t, charge(ctx, pool, "acct-1", fence(2, "pay.a", 2)), "another partition")
}

func TestMalformedFenceIsRefusedByTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := downstream(t)
	for _, f := range []wire.Fence{fence(-1, "pay.a", 1), fence(0, "pay.a", 0), fence(0, "pay", 1), fence(0, "pay.a.b", 1), fence(0, "", 1)} {
		require.ErrorIs(t, charge(ctx, pool, "acct-1", f), fencecheck.ErrMalformed, "%+v", f)
	}
	require.Zero(t, charges(t, pool))
}

// A write of the old generation in flight holds the row: the successor's
// admit waits for it, and once the successor committed, the old holder's
// next write is refused. The check never lets the two interleave.
func TestConcurrentWritersOfOneResourceAreSerialised(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := downstream(t)
	// The row exists, so only the admit's row lock can make anyone wait.
	require.NoError(t, charge(ctx, pool, "acct-1", fence(4, "pay.a", 1)))
	old, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer old.Rollback(ctx) //nolint:errcheck
	require.NoError(t, fencecheck.Admit(ctx, old, "account/acct-1", fence(4, "pay.a", 1)))

	done := make(chan error, 1)
	go func() { done <- charge(ctx, pool, "acct-1", fence(4, "pay.b", 2)) }()
	select {
	case err := <-done:
		t.Fatalf("the successor's admit did not wait for the old holder's transaction: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	_, err = old.Exec(ctx, `INSERT INTO charges (account, holder, generation) VALUES ('acct-1', 'pay.a', 1)`)
	require.NoError(t, err)
	require.NoError(t, old.Commit(ctx))
	require.NoError(t, <-done)
	require.ErrorIs(t, charge(ctx, pool, "acct-1", fence(4, "pay.a", 1)), fencecheck.ErrSuperseded)
	require.Equal(t, 3, charges(t, pool))
}

// A rolled-back write leaves no trace of its generation: the holder it
// would have fenced keeps writing.
func TestRolledBackAdmissionFencesNobody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := downstream(t)
	require.NoError(t, charge(ctx, pool, "acct-1", fence(1, "pay.a", 1)))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, fencecheck.Admit(ctx, tx, "account/acct-1", fence(1, "pay.b", 2)))
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, charge(ctx, pool, "acct-1", fence(1, "pay.a", 1)))
}
