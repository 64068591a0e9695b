package fence

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The shadow fence (docs/contract.md §13). A partition's fence mode is
// ModeEnforce (the default) or ModeObserve. Both evaluate the same fence
// predicate in the same transaction, on the lease row the append holds
// locked; the mode is read with it, and ledger.set_fence_mode takes that
// row FOR UPDATE, so an append decides and commits under one mode. In
// ModeObserve an event the fence would refuse as stale commits anyway,
// decided like any other (dense versions, duplicates, conflicts, gaps),
// and its row, result and log copy carry WouldReject. A partition never
// leased has no lease row to commit against: its events are refused
// stale/no_lease in both modes.

// Fence modes.
const (
	ModeEnforce = "enforce"
	ModeObserve = "observe"
)

func modeOf(l leaseState) string {
	if l.observe {
		return ModeObserve
	}
	return ModeEnforce
}

// observing reports whether a stale event of this lease commits anyway.
func observing(leased bool, l leaseState) bool { return leased && l.observe }

const (
	sqlSetFenceMode = `SELECT coalesce(holder, ''), coalesce(generation, 0), at FROM ledger.set_fence_mode($1, $2, $3, $4)`

	// sqlWouldReject counts the commits of partitions $1 (null: all) since
	// $2 that enforce would have refused, by partition and reason, with the
	// newest of each.
	sqlWouldReject = `
SELECT partition, would_reject, count(*), max(committed_at)
FROM ledger.events
WHERE would_reject IS NOT NULL AND committed_at >= $2 AND ($1::int[] IS NULL OR partition = ANY($1::int[]))
GROUP BY partition, would_reject ORDER BY partition, would_reject`

	sqlFenceModes = `SELECT partition, mode, changed_by, db_user, changed_at FROM ledger.fence_modes ORDER BY partition`
)

// SetFenceMode switches partition to mode (ModeEnforce or ModeObserve),
// recorded in ledger.lease_actions with by and reason. It waits for the
// appends in flight on the partition.
func SetFenceMode(ctx context.Context, pool *pgxpool.Pool, partition int, mode, by, reason string) (Action, error) {
	if mode != ModeEnforce && mode != ModeObserve {
		return Action{}, fmt.Errorf("fence: mode %q is neither %s nor %s", mode, ModeEnforce, ModeObserve)
	}
	a := Action{Partition: partition, Kind: mode, By: by, Reason: reason}
	err := pool.QueryRow(ctx, sqlSetFenceMode, partition, mode, by, reason).Scan(&a.Holder, &a.Generation, &a.At)
	if err != nil {
		return a, fmt.Errorf("fence: set partition %d to %s: %w", partition, mode, err)
	}
	return a, nil
}

// FenceMode is a partition's mode as ledger.fence_modes records it.
type FenceMode struct {
	Partition  int
	Mode       string
	By, DBUser string
	At         time.Time
}

// FenceModes lists the partitions whose mode was ever set; the others
// are in ModeEnforce.
func FenceModes(ctx context.Context, pool *pgxpool.Pool) ([]FenceMode, error) {
	rows, err := pool.Query(ctx, sqlFenceModes)
	if err != nil {
		return nil, fmt.Errorf("fence: list fence modes: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (FenceMode, error) {
		var m FenceMode
		err := r.Scan(&m.Partition, &m.Mode, &m.By, &m.DBUser, &m.At)
		return m, err
	})
}

// WouldRejectCount is how many commits of a partition enforce would have
// refused for one reason, and when the newest was committed.
type WouldRejectCount struct {
	Partition   int
	WouldReject string
	Count       int64
	Last        time.Time
}

// WouldReject reports the commits since since that enforce would have
// refused, on partitions (nil: all).
func WouldReject(ctx context.Context, pool *pgxpool.Pool, partitions []int32, since time.Time) ([]WouldRejectCount, error) {
	rows, err := pool.Query(ctx, sqlWouldReject, partitions, since)
	if err != nil {
		return nil, fmt.Errorf("fence: would-reject report: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (WouldRejectCount, error) {
		var c WouldRejectCount
		err := r.Scan(&c.Partition, &c.WouldReject, &c.Count, &c.Last)
		return c, err
	})
}
