package fence_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// BenchmarkAppend measures Append on one connection's worth of calls, with
// every check in place: 16 partitions, ~200-byte JSON payloads, 1000 tasks
// advancing one version per event; with fresh, every event is the first of
// a task new to the ledger (a worker starting on new work); careful keeps
// every append off the one-round-trip fast path (fast.go). It reports
// events/s.
func BenchmarkAppend(b *testing.B) {
	for _, c := range []struct {
		size           int
		fresh, careful bool
	}{{1, false, false}, {1, false, true}, {100, false, false}, {100, false, true}, {1000, false, false},
		{1000, false, true}, {1000, true, false}} {
		size := c.size
		name := fmt.Sprintf("batch=%d", size)
		if c.fresh {
			name += "/fresh"
		}
		if c.careful {
			name += "/careful"
		}
		b.Run(name, func(b *testing.B) {
			s, _ := newStore(b, fence.Config{})
			if c.careful {
				s = fence.WithoutFastPath(s)
			}
			benchAppend(b, s, size, c.fresh)
		})
	}
}

// BenchmarkAppendDatabaseFence measures what the database's own fence
// (migration 00012: the triggers that hold the ingest's role to the fence)
// costs an append, as BenchmarkAppend does, through a LOGIN user in
// ledger_ingest: one database with the triggers and one with them disabled,
// appended to in turn, batch by batch, so that both see the same machine.
// It reports events/s of each and their ratio.
func BenchmarkAppendDatabaseFence(b *testing.B) {
	for _, size := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			var sides [2]*benchAppender // with the triggers, without
			for i := range sides {
				_, db := newStore(b, fence.Config{})
				if i == 1 {
					_, err := db.Pool.Exec(context.Background(), sqlDisableDatabaseFence)
					require.NoError(b, err)
				}
				s, err := fence.New(ingestPool(b, db), fence.Config{})
				require.NoError(b, err)
				sides[i] = newBenchAppender(b, s, size, false)
			}
			var spent [2]time.Duration
			b.ResetTimer()
			for n := range b.N {
				first := n % 2 // alternate which side goes first
				spent[first] += sides[first].step(b)
				spent[1-first] += sides[1-first].step(b)
			}
			on, off := float64(b.N*size)/spent[0].Seconds(), float64(b.N*size)/spent[1].Seconds()
			b.ReportMetric(on, "events/s-dbfence")
			b.ReportMetric(off, "events/s-without")
			b.ReportMetric(on/off, "ratio")
		})
	}
}

// sqlDisableDatabaseFence switches migration 00012's triggers off.
const sqlDisableDatabaseFence = `
ALTER TABLE ledger.events DISABLE TRIGGER events_fence;
ALTER TABLE ledger.heads DISABLE TRIGGER heads_fence_insert;
ALTER TABLE ledger.heads DISABLE TRIGGER heads_fence_update;
ALTER TABLE ledger.event_ids DISABLE TRIGGER event_ids_fence;
ALTER TABLE ledger.leases DISABLE TRIGGER leases_fence;
ALTER TABLE ledger.lease_grants DISABLE TRIGGER lease_grants_fence`

// ingestPool is a pool on db as a new LOGIN user in ledger_ingest, the
// role a deployment's ingest connects as; the user is dropped at cleanup.
func ingestPool(b testing.TB, db *dbtest.DB) *pgxpool.Pool {
	b.Helper()
	ctx := context.Background()
	user := "bench_ingest_" + strings.ToLower(newID()[16:])
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+user+" LOGIN IN ROLE ledger_ingest")
	require.NoError(b, err)
	b.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+user) })
	u, err := url.Parse(db.URL)
	require.NoError(b, err)
	u.User = url.User(user)
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(b, err)
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	return pool
}

// benchAppend appends batches of size events as BenchmarkAppend describes
// and reports events/s.
func benchAppend(b *testing.B, s *fence.Store, size int, fresh bool) {
	a := newBenchAppender(b, s, size, fresh)
	b.ResetTimer()
	var spent time.Duration // in Append only, not in building the batch
	for range b.N {
		spent += a.step(b)
	}
	b.ReportMetric(float64(b.N*size)/spent.Seconds(), "events/s")
}

// benchAppender appends BenchmarkAppend's batches to one store: 16
// partitions it holds, 1000 tasks (or a new task per event with fresh).
type benchAppender struct {
	s        *fence.Store
	leases   []fence.Lease
	versions []int64
	next     int
	batch    []fence.Event
	fresh    bool
	filler   string
}

func newBenchAppender(b *testing.B, s *fence.Store, size int, fresh bool) *benchAppender {
	ctx := context.Background()
	const partitions, tasks = 16, 1000
	a := &benchAppender{s: s, leases: make([]fence.Lease, partitions), versions: make([]int64, tasks),
		batch: make([]fence.Event, size), fresh: fresh, filler: strings.Repeat("x", 150)}
	for p := range partitions {
		l, err := s.Acquire(ctx, p, fmt.Sprintf("bench.%d", p), fence.TTLMax)
		require.NoError(b, err)
		a.leases[p] = l
	}
	return a
}

// step builds the next batch and returns how long its Append took.
func (a *benchAppender) step(b *testing.B) time.Duration {
	for i := range a.batch {
		task := a.next % 1000
		if a.fresh {
			task = a.next
			a.versions = append(a.versions, 0)
		}
		a.next++
		a.versions[task]++
		l := a.leases[task%len(a.leases)]
		a.batch[i] = fence.Event{
			ID: newID(), Partition: l.Partition, Task: fmt.Sprintf("task-%d", task),
			Version: a.versions[task], Type: "progress",
			Payload: []byte(fmt.Sprintf(`{"step":%d,"note":%q}`, a.versions[task], a.filler)),
			Holder:  l.Holder, Generation: l.Generation,
		}
	}
	start := time.Now()
	res, err := a.s.Append(context.Background(), a.batch)
	took := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range res {
		if r.Verdict != wire.VerdictCommitted {
			b.Fatalf("verdict %s/%s", r.Verdict, r.Reason)
		}
	}
	return took
}

// BenchmarkRenewUnderAppends measures how long a lease renewal takes while
// three appenders keep appending to the same partition with batches of
// 500: the renewal must never queue behind them. It reports the renewal's
// p50, p99 and max in milliseconds.
func BenchmarkRenewUnderAppends(b *testing.B) {
	s, _ := newStore(b, fence.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := s.Acquire(ctx, 0, "bench.1", fence.TTLMax)
	require.NoError(b, err)
	filler := strings.Repeat("x", 150)
	errs := make(chan error, 3)
	for w := range 3 {
		go func() {
			version := int64(0)
			for ctx.Err() == nil {
				batch := make([]fence.Event, 500)
				for i := range batch {
					version++
					batch[i] = fence.Event{ID: newID(), Partition: 0, Task: fmt.Sprintf("w%d", w), Version: version,
						Type: "progress", Payload: []byte(fmt.Sprintf(`{"note":%q}`, filler)), Holder: l.Holder, Generation: l.Generation}
				}
				if _, err := s.Append(ctx, batch); err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the appenders are under way
	var took []time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := s.Renew(ctx, 0, l.Holder, l.Generation, 0); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	cancel()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
	b.ReportMetric(ms(took[len(took)*99/100]), "p99-ms")
	b.ReportMetric(ms(took[len(took)-1]), "max-ms")
}
