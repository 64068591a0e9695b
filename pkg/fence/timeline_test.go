package fence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/pgtemp"
	"github.com/flowness/ledger/migrations"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// witnessLog is a fence.TimelineWitness that records what it was asked,
// and how many rows of ledger.events and ledger.leases its database held
// then.
type witnessLog struct {
	mu    sync.Mutex
	calls []int64
	rows  []int64
	fail  error
	count func() int64
}

func (w *witnessLog) record(_ context.Context, timeline int64) (int64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail != nil {
		return 0, w.fail
	}
	w.calls = append(w.calls, timeline)
	if w.count != nil {
		w.rows = append(w.rows, w.count())
	}
	return timeline, nil
}

// A guard with a witness takes a server's timeline only once the witness
// recorded it: while the witness cannot, the connection fails with a
// transient error and nothing is granted.
func TestAGuardTakesATimelineOnlyOnceWitnessed(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, fence.Config{})
	ctx := context.Background()
	g := &fence.PrimaryGuard{}
	w := &witnessLog{fail: errors.New("NATS is down")}
	g.SetWitness(w.record)
	pc, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	fence.GuardPool(pc, g)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer pool.Close()
	s, err := fence.New(pool, fence.Config{Primary: g})
	require.NoError(t, err)

	_, err = s.Acquire(ctx, 1, "worker-a.1", time.Minute)
	require.ErrorIs(t, err, fence.ErrUnwitnessedTimeline)
	require.True(t, fence.IsTransient(err))
	require.Zero(t, g.Newest())
	var leases int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger.leases`).Scan(&leases))
	require.Zero(t, leases)

	w.mu.Lock()
	w.fail = nil
	w.mu.Unlock()
	_, err = s.Acquire(ctx, 1, "worker-a.1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, []int64{1}, w.calls)
	require.Equal(t, int64(1), g.Newest())
}

// A connection opened to a standby (which shows no timeline to check) is
// still open when the standby is promoted. The first append or grant on
// it finds a timeline the witness has not recorded, has the witness record
// it, and only then writes. Switch: Config.Primary without SetWitness
// checks only that the server is not older, and writes unwitnessed.
func TestAWriteOnAPromotedConnectionWaitsForTheWitness(t *testing.T) {
	t.Parallel()
	for _, what := range []string{"append", "grant"} {
		t.Run(what, func(t *testing.T) {
			ctx := context.Background()
			primary, err := pgtemp.StartWith(ctx, pgtemp.Options{TCP: true, Port: freePort(t)})
			require.NoError(t, err)
			t.Cleanup(primary.Stop)
			setup, err := pgxpool.New(ctx, primary.URL())
			require.NoError(t, err)
			_, err = migrations.Up(ctx, setup, nil)
			require.NoError(t, err)
			setupStore, err := fence.New(setup, fence.Config{})
			require.NoError(t, err)
			l, err := setupStore.Acquire(ctx, 0, "worker-a.1", 5*time.Minute)
			require.NoError(t, err)
			setup.Close()
			standby, err := primary.StartStandby(ctx, pgtemp.Options{Port: freePort(t)}, "s1")
			require.NoError(t, err)
			t.Cleanup(standby.Stop)

			g := &fence.PrimaryGuard{}
			w := &witnessLog{count: func() int64 {
				n, err := standby.Count(ctx, `SELECT (SELECT count(*) FROM ledger.events) + (SELECT count(*) FROM ledger.leases)`)
				require.NoError(t, err)
				return n
			}}
			g.SetWitness(w.record)
			pc, err := pgxpool.ParseConfig(standby.URL())
			require.NoError(t, err)
			pc.MaxConns = 1
			fence.GuardPool(pc, g)
			pool, err := pgxpool.NewWithConfig(ctx, pc)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			require.NoError(t, pool.Ping(ctx))
			s, err := fence.New(pool, fence.Config{Primary: g})
			require.NoError(t, err)
			require.Zero(t, g.Newest(), "a standby shows no timeline")
			require.NoError(t, standby.Promote(ctx))

			if what == "append" {
				res, err := s.Append(ctx, []fence.Event{{ID: newID(), Partition: 0, Task: "promoted", Version: 1,
					Type: "step", Payload: []byte(`{}`), Holder: "worker-a.1", Generation: l.Generation}})
				require.NoError(t, err)
				require.Equal(t, wire.VerdictCommitted, res[0].Verdict)
			} else {
				_, err := s.Acquire(ctx, 1, "worker-b.1", time.Minute)
				require.NoError(t, err)
			}
			require.Equal(t, []int64{2}, w.calls, "the promoted server's timeline was witnessed")
			require.Equal(t, []int64{1}, w.rows, "before anything was written on it (the one lease is from before)")
			require.Equal(t, int64(2), g.Newest())
		})
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	port, err := pgtemp.FreePort()
	require.NoError(t, err)
	return port
}
