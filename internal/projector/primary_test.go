package projector_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// The projector reads its database on timeline 1. Then the ingests record
// timeline 2 in ledger_witness: a standby was promoted, and this database
// is an old primary that came back writable. The projector's pool drops
// its connections and refuses new ones, so no gap re-fetch or
// reconciliation reads the old primary; a multi-host URL moves on to the
// next host. Switch: WithoutTimelineFollow, and the pool goes on serving.
func TestProjectorStopsReadingASupersededPrimary(t *testing.T) {
	t.Parallel()
	for _, followed := range []bool{true, false} {
		t.Run(fmt.Sprintf("followed=%v", followed), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t)
			g := &fence.PrimaryGuard{}
			pc, err := pgxpool.ParseConfig(e.db.URL)
			require.NoError(t, err)
			fence.GuardPool(pc, g)
			pool, err := pgxpool.NewWithConfig(ctx, pc)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			p, err := projector.New(projector.Config{}, projector.Deps{NC: e.ns.Conn(t), Pool: pool,
				Logger: ledgertest.Logger(), Primary: g})
			require.NoError(t, err)
			if !followed {
				projector.WithoutTimelineFollow(p)
			}
			require.NoError(t, p.Start(ctx))
			t.Cleanup(p.Stop)
			require.NoError(t, pool.Ping(ctx))
			require.Equal(t, int64(1), g.Newest(), "the guard learned the server's timeline")

			cfg, err := streams.Bucket(wire.BucketWitness, streams.Options{})
			require.NoError(t, err)
			kv, err := e.js.CreateOrUpdateKeyValue(ctx, cfg)
			require.NoError(t, err)
			_, err = kv.PutString(ctx, streams.TimelineKey, "2")
			require.NoError(t, err)
			refused := func() bool { return errors.Is(pool.Ping(ctx), fence.ErrSupersededPrimary) }
			if !followed {
				require.Never(t, refused, 2*time.Second, 50*time.Millisecond, "the negative control: it reads on")
				return
			}
			require.Eventually(t, refused, 5*time.Second, 20*time.Millisecond, "the projector still reads the old primary")
		})
	}
}
