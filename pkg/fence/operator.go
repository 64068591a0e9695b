package fence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The operator's fence (docs/contract.md §12): an operator revokes a
// partition's lease at once, or cordons a partition so that nobody is
// granted it until it is uncordoned. PostgreSQL does both (migration
// 00014): ledger.revoke_lease and ledger.cordon_partition, which the role
// ledger_operator may execute, and a trigger on ledger.lease_grants that
// refuses every grant of a cordoned partition.
//
// A revoke takes the lease row FOR UPDATE, as a takeover does: every event
// of the revoked generation commits before it or not at all. It raises the
// generation and grants it to nobody. The cordon's trigger runs in the
// statement that moves the lease, so no path grants a cordoned partition.

// Kinds of operator action, as ledger.lease_actions records them.
const (
	ActionRevoke   = "revoke"
	ActionCordon   = "cordon"
	ActionUncordon = "uncordon"
)

// Action is one recorded operator action on a partition.
type Action struct {
	Partition int
	// Kind is ActionRevoke, ActionCordon or ActionUncordon.
	Kind string
	// Holder and Generation are the lease when the action was taken (empty
	// and 0: never leased). A revoke fenced that holder at that generation.
	Holder     string
	Generation int64
	// NewGeneration is the generation a revoke raised the partition to.
	NewGeneration int64
	// By is who the operator said they are; DBUser the database user
	// that ran the action.
	By, DBUser string
	Reason     string
	At         time.Time
}

// ErrNeverLeased is Revoke's error for a partition that was never leased:
// there is nobody to fence.
var ErrNeverLeased = errors.New("fence: the partition was never leased")

// sqlStateCordoned is raised by ledger.cordon_check when a grant of a
// cordoned partition is attempted; sqlStateNeverLeased by
// ledger.revoke_lease.
const (
	sqlStateCordoned    = "LFC01"
	sqlStateNeverLeased = "LFR01"
)

const (
	sqlRevoke = `SELECT holder, generation, new_generation, at FROM ledger.revoke_lease($1, $2, $3, $4)`
	sqlCordon = `SELECT coalesce(holder, ''), coalesce(generation, 0), at FROM ledger.cordon_partition($1, $2, $3, $4)`

	sqlActionColumns = `partition, action, coalesce(holder, ''), coalesce(generation, 0), coalesce(new_generation, 0),
       by_name, db_user, reason, at`
	// sqlActions lists the newest actions, of one partition ($1) or of all
	// (null), at most $2, newest first.
	sqlActions = `SELECT ` + sqlActionColumns + ` FROM ledger.lease_actions
WHERE $1::int IS NULL OR partition = $1 ORDER BY id DESC LIMIT $2`
	// sqlRevokeOf finds the revoke that fenced generation $2 of partition $1.
	sqlRevokeOf = `SELECT ` + sqlActionColumns + ` FROM ledger.lease_actions
WHERE partition = $1 AND action = 'revoke' AND generation = $2 ORDER BY id LIMIT 1`
	// sqlCordons lists the partitions cordoned now, with the cordon.
	sqlCordons = `
SELECT partition, 'cordon', '', 0::bigint, 0::bigint, changed_by, db_user, reason, changed_at
FROM ledger.partition_controls WHERE cordoned ORDER BY partition`
	sqlCordonOf = `
SELECT partition, 'cordon', '', 0::bigint, 0::bigint, changed_by, db_user, reason, changed_at
FROM ledger.partition_controls WHERE partition = $1 AND cordoned`
)

// Revoke fences the current holder of partition now: the generation rises
// to at least floor and above the current one, and the lease expires at
// once, so the holder's next write is stale/superseded and its next renewal
// lost. It waits for the appends in flight on the partition. witness, if
// not nil, is called with the new generation before the revoke commits,
// and a failure of it rolls the revoke back: the caller records it where
// the next grant's floor is read (the ingest's ledger_witness).
func Revoke(ctx context.Context, pool *pgxpool.Pool, partition int, by, reason string, floor int64,
	witness func(ctx context.Context, generation int64) error) (Action, error) {
	a := Action{Partition: partition, Kind: ActionRevoke, By: by, Reason: reason}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, sqlRevoke, partition, floor, by, reason).Scan(&a.Holder, &a.Generation, &a.NewGeneration, &a.At)
		if sqlState(err) == sqlStateNeverLeased {
			return fmt.Errorf("%w: partition %d", ErrNeverLeased, partition)
		}
		if err != nil {
			return fmt.Errorf("fence: revoke partition %d: %w", partition, err)
		}
		if witness != nil {
			return witness(ctx, a.NewGeneration)
		}
		return nil
	})
	return a, err
}

// Cordon stops (on) or resumes (off) every grant of partition. A cordoned
// partition's holder keeps its lease and may renew and release it; no
// acquire is granted, not even to that holder, until it is uncordoned.
func Cordon(ctx context.Context, pool *pgxpool.Pool, partition int, on bool, by, reason string) (Action, error) {
	a := Action{Partition: partition, Kind: ActionUncordon, By: by, Reason: reason}
	if on {
		a.Kind = ActionCordon
	}
	err := pool.QueryRow(ctx, sqlCordon, partition, on, by, reason).Scan(&a.Holder, &a.Generation, &a.At)
	if err != nil {
		return a, fmt.Errorf("fence: %s partition %d: %w", a.Kind, partition, err)
	}
	return a, nil
}

// Actions lists the newest operator actions, of partition (-1: all), at
// most limit, newest first.
func Actions(ctx context.Context, pool *pgxpool.Pool, partition, limit int) ([]Action, error) {
	var only *int
	if partition >= 0 {
		only = &partition
	}
	rows, err := pool.Query(ctx, sqlActions, only, limit)
	if err != nil {
		return nil, fmt.Errorf("fence: list operator actions: %w", err)
	}
	return pgx.CollectRows(rows, scanAction)
}

// Cordons lists the partitions cordoned now, each with its cordon.
func Cordons(ctx context.Context, pool *pgxpool.Pool) ([]Action, error) {
	rows, err := pool.Query(ctx, sqlCordons)
	if err != nil {
		return nil, fmt.Errorf("fence: list cordons: %w", err)
	}
	return pgx.CollectRows(rows, scanAction)
}

func scanAction(r pgx.CollectableRow) (Action, error) {
	var a Action
	err := r.Scan(&a.Partition, &a.Kind, &a.Holder, &a.Generation, &a.NewGeneration, &a.By, &a.DBUser, &a.Reason, &a.At)
	return a, err
}

// revokeOf returns the revoke that fenced generation of partition, if any.
func (s *Store) revokeOf(ctx context.Context, partition int, generation int64) *Action {
	rows, err := s.pool.Query(ctx, sqlRevokeOf, partition, generation)
	if err != nil {
		return nil
	}
	a, err := pgx.CollectExactlyOneRow(rows, scanAction)
	if err != nil {
		return nil
	}
	return &a
}

// cordoned turns a grant refused by ledger.cordon_check into ErrHeld with
// the cordon; any other error is returned as it is.
func (s *Store) cordoned(ctx context.Context, partition int, err error) error {
	if sqlState(err) != sqlStateCordoned {
		return err
	}
	le := &LeaseError{Kind: ErrHeld, Msg: fmt.Sprintf("partition %d is cordoned: no grant until it is uncordoned", partition)}
	if rows, qerr := s.pool.Query(ctx, sqlCordonOf, partition); qerr == nil {
		if a, aerr := pgx.CollectExactlyOneRow(rows, scanAction); aerr == nil {
			le.Cordon = &a
			le.Msg = fmt.Sprintf("partition %d is cordoned by %s since %s (%s): no grant until it is uncordoned",
				partition, a.By, a.At.UTC().Format(time.RFC3339), a.Reason)
		}
	}
	if cur, gerr := s.Get(ctx, partition); gerr == nil {
		le.Current = &cur
	}
	return le
}
