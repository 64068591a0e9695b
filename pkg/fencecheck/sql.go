package fencecheck

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flowness/ledger/pkg/wire"
)

// SQL is fencecheck.sql: the table ledger_fence.high_water and the function
// ledger_fence.admit. Apply it once per downstream database; it is
// idempotent.
//
//go:embed fencecheck.sql
var SQL string

// SQLSTATEs the admit function raises (fencecheck.sql).
const (
	// CodeSuperseded: the generation is below the highest seen.
	CodeSuperseded = "LF001"
	// CodeHolderMismatch: the generation is the highest seen, under another holder.
	CodeHolderMismatch = "LF002"
	// CodeMalformed: the fence is not one the ledger grants.
	CodeMalformed = "LF003"
)

// Errors callers branch on.
var (
	// ErrSuperseded is a fence whose generation is below the highest seen
	// for its resource and partition: its holder has been replaced.
	ErrSuperseded = errors.New("fencecheck: superseded holder")
	// ErrHolderMismatch is a fence whose generation was seen under another
	// holder.
	ErrHolderMismatch = errors.New("fencecheck: generation of another holder")
	// ErrMalformed is a fence that is missing or not one the ledger grants.
	ErrMalformed = errors.New("fencecheck: malformed fence")
)

// RefusedError is a refused fence. It matches ErrSuperseded,
// ErrHolderMismatch or ErrMalformed with errors.Is.
type RefusedError struct {
	// Resource and Fence are what was refused.
	Resource string
	Fence    wire.Fence
	// Highest is the highest generation seen for the resource and
	// partition, when known (ErrSuperseded), else 0.
	Highest int64
	// Reason is ErrSuperseded, ErrHolderMismatch or ErrMalformed.
	Reason error
	// Detail says what was compared, in words.
	Detail string
}

func (e *RefusedError) Error() string { return e.Reason.Error() + ": " + e.Detail }

// Unwrap returns e.Reason.
func (e *RefusedError) Unwrap() error { return e.Reason }

// Execer runs a statement: a pgx.Tx, *pgx.Conn or *pgxpool.Pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Apply creates (or updates) the fence table and function in db.
func Apply(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, SQL); err != nil {
		return fmt.Errorf("fencecheck: apply fencecheck.sql: %w", err)
	}
	return nil
}

// Admit checks f for resource inside tx, the transaction of the write it
// guards: it returns a *RefusedError for a superseded, mismatched or
// malformed fence, and otherwise records f's generation and holds the
// (resource, partition) row locked until tx ends. After a refusal tx is
// aborted; roll it back. In REPEATABLE READ or SERIALIZABLE transactions a
// concurrent admit can also fail it with a serialization failure (40001),
// which the caller retries as usual.
func Admit(ctx context.Context, tx Execer, resource string, f wire.Fence) error {
	_, err := tx.Exec(ctx, `SELECT ledger_fence.admit($1, $2, $3, $4)`, resource, f.Partition, f.Holder, f.Generation)
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		refused := &RefusedError{Resource: resource, Fence: f, Detail: pgErr.Message}
		switch pgErr.Code {
		case CodeSuperseded:
			refused.Reason = ErrSuperseded
			refused.Highest, _ = strconv.ParseInt(pgErr.Detail, 10, 64)
			return refused
		case CodeHolderMismatch:
			refused.Reason = ErrHolderMismatch
			return refused
		case CodeMalformed:
			refused.Reason = ErrMalformed
			return refused
		}
	}
	return fmt.Errorf("fencecheck: admit fence %s for %q: %w", f, resource, err)
}
