package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/internal/pgtemp"
	"github.com/flowness/ledger/migrations"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// An ingest commits on the primary (timeline 1), which ledger_witness
// records. The standby is promoted (timeline 2) while the old primary
// stays writable, and the ingest's connections move to the new one
// between two of its beats. Nothing commits on timeline 2 before the
// witness records it, so an ingest that starts against the old primary
// right after that commit is refused there and grants nothing; one that
// was already running there stops granting within a moment, not at its
// next beat 20 s on.
//
// Switches: NoTimelineWitness (the witness learns timeline 2 only at the
// first ingest's next beat, and the ingest that starts on the old primary
// grants there: one generation for two holders) and NoTimelineFollow (the
// ingest running on the old primary goes on granting there).
func TestANewPrimarysTimelineIsWitnessedBeforeAnythingCommitsOnIt(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ witnessed, followed bool }{{true, true}, {false, true}, {true, false}} {
		t.Run(fmt.Sprintf("witnessed=%v/followed=%v", c.witnessed, c.followed), func(t *testing.T) {
			ctx := context.Background()
			old, err := pgtemp.StartWith(ctx, pgtemp.Options{TCP: true, Port: tcpPort(t)})
			require.NoError(t, err)
			t.Cleanup(old.Stop)
			standby, err := old.StartStandby(ctx, pgtemp.Options{Port: tcpPort(t)}, "s1")
			require.NoError(t, err)
			t.Cleanup(standby.Stop)
			// As behind a failover: the standby first, the primary second,
			// connections only to a writable server.
			both := fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write",
				standby.HostPort(), old.HostPort())
			store, pool := guardedStore(t, both)
			_, err = migrations.Up(ctx, pool, nil)
			require.NoError(t, err)

			e := &env{t: t, ns: natstest.Start(t), store: store}
			e.nc, e.js = e.ns.Conn(t), e.ns.JetStream(t)
			// Beats every 20 s: none in the test's window after the failover.
			cfg := ingest.WithTestHooks(ingest.Config{ClaimTTL: time.Minute},
				ingest.TestHooks{NoTimelineWitness: !c.witnessed})
			e.startIngestOn(cfg, store)
			rc := e.receipts("worker-a.1")
			l := e.acquire(0, "worker-a.1", 120000)
			ev := func(v int64) event {
				return event{id: newID(), partition: 0, task: "failover", holder: "worker-a.1", generation: l.Generation,
					version: v, typ: "step", payload: `{}`}
			}
			first := ev(1)
			e.publish(first)
			require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, first.id).Verdict)
			require.Equal(t, "1", witnessedTimeline(t, e))

			// The standby has the commit; it is promoted, and the ingest's
			// connections to the old primary end. Another ingest runs on
			// the old primary alone: nothing it knows is newer yet.
			require.Eventually(t, func() bool {
				n, err := standby.Count(ctx, `SELECT count(*) FROM ledger.events`)
				return err == nil && n == 1 // the schema may not have reached it yet
			}, 20*time.Second, 20*time.Millisecond)
			require.NoError(t, standby.Promote(ctx))
			require.NoError(t, old.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`))
			runningStore, _ := guardedStore(t, old.URL())
			e.startIngestOn(ingest.WithTestHooks(ingest.Config{ClaimTTL: time.Minute},
				ingest.TestHooks{NoTimelineFollow: !c.followed}), runningStore)
			_, err = runningStore.Acquire(ctx, 1, "worker-b.1", time.Minute)
			require.NoError(t, err, "before anything is written on the new primary, the old one still grants")

			second := ev(2)
			e.publish(second)
			require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, second.id).Verdict)
			require.Equal(t, int64(2), countOn(t, standby, `SELECT count(*) FROM ledger.events`), "committed on the new primary")

			// An ingest starts against the old primary alone.
			lateStore, _ := guardedStore(t, old.URL())
			late, _ := e.startIngestOn(ingest.Config{ClaimTTL: time.Minute}, lateStore)
			_, err = lateStore.Acquire(ctx, 2, "worker-c.1", time.Minute)
			if !c.witnessed {
				require.NoError(t, err, "the negative control: the old primary grants")
				return
			}
			require.Equal(t, "2", witnessedTimeline(t, e), "the commit on timeline 2 waited for its witnessing")
			require.ErrorIs(t, err, fence.ErrSupersededPrimary)
			require.ErrorIs(t, late.CheckPrimary(ctx), fence.ErrSupersededPrimary)

			refused := func() bool {
				_, err := runningStore.Acquire(ctx, 1, "worker-b.1", time.Minute)
				return errors.Is(err, fence.ErrSupersededPrimary)
			}
			if !c.followed {
				require.Never(t, refused, 3*time.Second, 100*time.Millisecond, "the negative control: it grants until its beat")
				return
			}
			require.Eventually(t, refused, 5*time.Second, 50*time.Millisecond, "the running ingest went on granting")
		})
	}
}

// guardedStore is a store on url whose pool refuses a superseded primary.
func guardedStore(t *testing.T, url string) (*fence.Store, *pgxpool.Pool) {
	t.Helper()
	pc, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	g := &fence.PrimaryGuard{}
	fence.GuardPool(pc, g)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := fence.New(pool, fence.Config{Primary: g})
	require.NoError(t, err)
	return store, pool
}

func witnessedTimeline(t *testing.T, e *env) string {
	t.Helper()
	cfg, err := streams.Bucket(wire.BucketWitness, streams.Options{})
	require.NoError(t, err)
	kv, err := e.js.KeyValue(context.Background(), cfg.Bucket)
	require.NoError(t, err)
	v, err := kv.Get(context.Background(), "timeline")
	require.NoError(t, err)
	return string(v.Value())
}

func countOn(t *testing.T, c *pgtemp.Cluster, sql string) int64 {
	t.Helper()
	n, err := c.Count(context.Background(), sql)
	require.NoError(t, err)
	return n
}

func tcpPort(t *testing.T) int {
	t.Helper()
	port, err := pgtemp.FreePort()
	require.NoError(t, err)
	return port
}
