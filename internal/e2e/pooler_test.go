package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/migrations"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// The ingest, its lease service and the projector work through a stock
// PgBouncer (Debian's, which refuses unknown startup parameters) in
// session and in transaction mode: several workers hold leases, renew
// them and publish at once, every event commits, every task is projected,
// readiness holds, and a rebuild through the pooler gives the same
// projections.
func TestServicesWorkThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"session", "transaction"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := dbtest.New(t)
			pb := dbtest.StartPgBouncer(t, mode)
			ns := natstest.Start(t)
			log := slog.New(slog.DiscardHandler)
			conn := connect.Options{DatabaseURL: pb.URL(t, db.Name), Name: "ledger-ingest", MinPoolSize: 12}
			pool, err := conn.Postgres(ctx)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			require.Equal(t, mode == "transaction", conn.Session.Pooled)
			require.True(t, conn.Session.Proxied)
			require.Equal(t, pgx.QueryExecModeCacheDescribe, conn.Session.ExecMode)
			_, err = migrations.Up(ctx, pool, nil)
			require.NoError(t, err)

			store, err := fence.New(pool, fence.Config{})
			require.NoError(t, err)
			in, err := ingest.New(ingest.Config{}, ingest.Deps{NC: ns.Conn(t), Store: store, Logger: log})
			require.NoError(t, err)
			require.NoError(t, in.Start(ctx))
			t.Cleanup(in.Stop)
			proj, err := projector.New(projector.Config{}, projector.Deps{NC: ns.Conn(t), Pool: pool, Logger: log})
			require.NoError(t, err)
			require.NoError(t, proj.Start(ctx))

			const workers, tasksEach, versions = 4, 3, 5
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				nc := ns.Conn(t, worker.InboxOption(fmt.Sprintf("pooled.w%d", w)))
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- runWorker(ctx, nc, w, tasksEach, versions, log)
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.NoError(t, conn.CheckPooler(pool)(ctx), "readiness holds")

			js := ns.JetStream(t)
			kv, err := js.KeyValue(ctx, wire.BucketTasks)
			require.NoError(t, err)
			want := map[string]int64{}
			for w := range workers {
				for i := range tasksEach {
					want[fmt.Sprintf("w%d-t%d", w, i)] = versions
				}
			}
			projected := func() bool {
				for task, v := range want {
					entry, err := kv.Get(ctx, task)
					if err != nil {
						return false
					}
					var st projection.State
					if json.Unmarshal(entry.Value(), &st) != nil || st.Version != v {
						return false
					}
				}
				return true
			}
			require.Eventually(t, projected, 20*time.Second, 50*time.Millisecond)

			// ledgerctl rebuild's path, through the pooler too.
			proj.Stop()
			again, err := projector.New(projector.Config{}, projector.Deps{NC: ns.Conn(t), Pool: pool, Logger: log})
			require.NoError(t, err)
			require.NoError(t, again.Rebuild(ctx, nil))
			require.True(t, projected(), "the rebuilt projections")
		})
	}
}

// runWorker is worker w: it holds partition w, publishes versions of its
// tasks, renews its lease meanwhile, and releases it.
func runWorker(ctx context.Context, nc *nats.Conn, w, tasks, versions int, log *slog.Logger) error {
	holder := fmt.Sprintf("pooled.w%d", w)
	c, err := worker.New(nc, worker.Config{Holder: holder, TTL: 5 * time.Second, Logger: log})
	if err != nil {
		return err
	}
	defer c.Close() //nolint:errcheck
	lease, err := c.Acquire(ctx, w)
	if err != nil {
		return fmt.Errorf("%s: acquire: %w", holder, err)
	}
	var ps []*worker.Pending
	for v := 1; v <= versions; v++ {
		for i := range tasks {
			p, err := lease.Publish(ctx, fmt.Sprintf("w%d-t%d", w, i), "step", []byte(fmt.Sprintf(`{"v":%d}`, v)))
			if err != nil {
				return fmt.Errorf("%s: publish: %w", holder, err)
			}
			ps = append(ps, p)
		}
		time.Sleep(400 * time.Millisecond) // spans a renewal of the 5 s lease (every TTL/3)
	}
	for _, p := range ps {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := p.Wait(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: event %s of %s: %w", holder, p.ID(), p.Task(), err)
		}
	}
	return lease.Release(ctx)
}
