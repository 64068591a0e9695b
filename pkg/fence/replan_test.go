package fence_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// A store's connections plan their statements again as the ledger grows
// from empty: after 5,000 events, each the first of a new task, the
// heads read a connection holds probes the primary key. Switch:
// WithoutReplan keeps the plan made while ledger.heads was empty, a scan
// of the whole table for every batch (3,640 against 11,662 events/s in
// batches of 100 on 2 CPUs, replan.go).
func TestAppendsPlanAgainAsTheTablesGrow(t *testing.T) {
	t.Parallel()
	for _, replan := range []bool{true, false} {
		t.Run(fmt.Sprintf("replan=%v", replan), func(t *testing.T) {
			t.Parallel()
			_, db := newStore(t, fence.Config{})
			// One connection, so the one the test asks is the one the
			// appends used.
			cfg := db.Pool.Config()
			cfg.MaxConns, cfg.MinConns = 1, 0
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			s, err := fence.New(pool, fence.Config{})
			require.NoError(t, err)
			// The careful path, which reads the heads of every batch: new
			// tasks alone take the fast path, which reads none.
			s = fence.WithoutFastPath(s)
			if !replan {
				s = fence.WithoutReplan(s)
			}
			ctx := context.Background()
			l, err := s.Acquire(ctx, 0, "grow.1", fence.TTLMax)
			require.NoError(t, err)
			for b := range 50 {
				batch := make([]fence.Event, 100)
				for i := range batch {
					batch[i] = ev(l, fmt.Sprintf("task-%d", b*100+i), 1, "step")
				}
				res, err := s.Append(ctx, batch)
				require.NoError(t, err)
				for _, r := range res {
					require.Equal(t, wire.VerdictCommitted, r.Verdict)
				}
			}
			conns := pool.AcquireAllIdle(ctx)
			defer func() {
				for _, c := range conns {
					c.Release()
				}
			}()
			var plans []string
			for _, c := range conns {
				var name string
				err := c.QueryRow(ctx, `SELECT name FROM pg_prepared_statements WHERE statement = $1`, fence.SQLAppendHeads).Scan(&name)
				if err != nil {
					continue // this connection did not read heads
				}
				rows, _ := c.Query(ctx, `EXPLAIN (COSTS OFF) EXECUTE `+name+`('{task-1,task-2}')`)
				plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(t, err)
				plans = append(plans, strings.Join(plan, "\n"))
			}
			require.Len(t, plans, 1, "the connection read heads")
			for _, p := range plans {
				if replan {
					require.NotContains(t, p, "Seq Scan", "the heads read scans ledger.heads:\n%s", p)
				} else {
					require.Contains(t, p, "Seq Scan", "the negative control keeps the empty table's plan:\n%s", p)
				}
			}
		})
	}
}
