package console

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// recentActionsShown is how many operator actions the partitions view
// lists.
const recentActionsShown = 20

// operatorAction is an operator's revoke, cordon or uncordon
// (docs/contract.md §12), as the partitions view shows it.
type operatorAction struct {
	Partition int
	Kind      string
	// Holder and Generation are the lease when it was taken; NewGeneration
	// is what a revoke raised the partition to.
	Holder                    string
	Generation, NewGeneration int64
	By, Reason                string
	// AgoMS is how long ago it was taken, by the database's clock.
	AgoMS int64
}

const (
	// sqlRecentActions lists the newest operator actions, at most $1.
	sqlRecentActions = `
SELECT partition, action, coalesce(holder, ''), coalesce(generation, 0), coalesce(new_generation, 0), by_name, reason,
       floor(extract(epoch FROM clock_timestamp() - at) * 1000)::bigint
FROM ledger.lease_actions ORDER BY id DESC LIMIT $1`

	// sqlObserved lists the partitions in the observe fence mode.
	sqlObserved = `SELECT partition FROM ledger.fence_modes WHERE mode = 'observe'`

	// sqlCordons lists the partitions cordoned now.
	sqlCordons = `
SELECT partition, 'cordon', '', 0::bigint, 0::bigint, changed_by, reason,
       floor(extract(epoch FROM clock_timestamp() - changed_at) * 1000)::bigint
FROM ledger.partition_controls WHERE cordoned ORDER BY partition`
)

// operatorActions reads the newest operator actions and the cordons now.
func (h *hub) operatorActions(ctx context.Context) ([]operatorAction, map[int]operatorAction, error) {
	scan := func(r pgx.CollectableRow) (operatorAction, error) {
		var a operatorAction
		err := r.Scan(&a.Partition, &a.Kind, &a.Holder, &a.Generation, &a.NewGeneration, &a.By, &a.Reason, &a.AgoMS)
		return a, err
	}
	rows, err := h.deps.Pool.Query(ctx, sqlRecentActions, recentActionsShown)
	if err != nil {
		return nil, nil, fmt.Errorf("list operator actions: %w", err)
	}
	recent, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, nil, fmt.Errorf("list operator actions: %w", err)
	}
	rows, err = h.deps.Pool.Query(ctx, sqlCordons)
	if err != nil {
		return nil, nil, fmt.Errorf("list cordons: %w", err)
	}
	cordons, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, nil, fmt.Errorf("list cordons: %w", err)
	}
	byPartition := make(map[int]operatorAction, len(cordons))
	for _, c := range cordons {
		byPartition[c.Partition] = c
	}
	return recent, byPartition, nil
}

// observed reads the partitions in the observe fence mode; every other
// partition enforces the fence.
func (h *hub) observed(ctx context.Context) (map[int]bool, error) {
	rows, err := h.deps.Pool.Query(ctx, sqlObserved)
	if err != nil {
		return nil, fmt.Errorf("list fence modes: %w", err)
	}
	out := map[int]bool{}
	var n int
	_, err = pgx.ForEachRow(rows, []any{&n}, func() error {
		out[n] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list fence modes: %w", err)
	}
	return out, nil
}
