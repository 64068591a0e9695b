package fence_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/fence"
)

// genericPlanCost is the total cost PostgreSQL gives the generic plan of
// sql, whose parameters are of types: the plan a prepared statement (pgx
// caches them) runs from its sixth execution on.
func genericPlanCost(t *testing.T, db *dbtest.DB, sql, types, args string) float64 {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE probe; RESET plan_cache_mode") }()
	_, err = conn.Exec(ctx, "PREPARE probe("+types+") AS "+sql)
	require.NoError(t, err)
	var plan []struct {
		Plan struct {
			TotalCost float64 `json:"Total Cost"`
		} `json:"Plan"`
	}
	var out []byte
	require.NoError(t, conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE probe("+args+")").Scan(&out))
	require.NoError(t, json.Unmarshal(out, &plan))
	require.Len(t, plan, 1)
	t.Logf("generic plan cost %.0f: %.60s", plan[0].Plan.TotalCost, strings.Join(strings.Fields(sql), " "))
	return plan[0].Plan.TotalCost
}

// A task's head is one row found by its key, and the planner must see it
// so. Before migration 00007 the one-row ledger.horizon, never analysed,
// was planned as about a thousand rows: the lookup's generic plan cost tens
// of thousands, crossed jit_above_cost (100,000) once the log had three
// partitions, and every lookup then paid ~10 ms of JIT compilation; an SDK
// starting on fresh tasks ran at 85 events/s. Switch: delete migration
// 00007 (its ANALYZE) and this test fails: the plan costs about 12,000
// on a fresh ledger, and more as partitions are added.
func TestHeadLookupIsPlannedAsTheOneRowProbeItIs(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, fence.Config{Partitions: 4})
	cost := genericPlanCost(t, db, fence.SQLTaskHead, "text", "'no-such-task'")
	require.Less(t, cost, 1000.0, "the generic plan of the head lookup costs %.0f", cost)

	// The lookup of many heads at once: a key probe per task (the planner
	// takes an array parameter for 100 elements), and the search of the
	// hot log for archived versions only where a task's history is.
	cost = genericPlanCost(t, db, fence.SQLTaskHeads, "text[]", "'{a,b}'")
	require.Less(t, cost, 2000.0, "the generic plan of the heads lookup costs %.0f", cost)
	cost = genericPlanCost(t, db, fence.SQLTaskHeadsArchived, "text[]", "'{a,b}'")
	require.Less(t, cost, 10000.0, "the generic plan of the archived versions' lookup costs %.0f", cost)
}
