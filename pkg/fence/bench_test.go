package fence_test

import (
	"context"
	"fmt"
	"io/fs"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/migrations"
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
		{1000, false, true}, {1000, true, false}, {100, true, false}} {
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
// ledger_ingest: one database with the triggers, one with migration 00012's
// bodies of them (before 00018 made them cheaper) and one with them
// disabled, appended to in turn, batch by batch, so that all see the same
// machine. It reports events/s of each and the ratios to the one without.
func BenchmarkAppendDatabaseFence(b *testing.B) {
	for _, size := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			// The triggers as they are, with migration 00012's bodies (00018
			// undone), and switched off.
			var sides [3]*benchAppender
			var dbs [3]*dbtest.DB
			var pools [3]*pgxpool.Pool
			for i := range sides {
				_, db := newStore(b, fence.Config{})
				dbs[i] = db
				// The triggers' own time, per function (pg_stat_user_functions).
				_, err := db.Pool.Exec(context.Background(), "ALTER DATABASE "+pgx.Identifier{dbName(b, db)}.Sanitize()+" SET track_functions = 'pl'")
				require.NoError(b, err)
				switch i {
				case 1:
					_, err = db.Pool.Exec(context.Background(), downOf(b, "00018_cheaper_database_fence.sql"))
					require.NoError(b, err)
				case 2:
					_, err = db.Pool.Exec(context.Background(), sqlDisableDatabaseFence)
					require.NoError(b, err)
				}
				pools[i] = ingestPool(b, db)
				s, err := fence.New(pools[i], fence.Config{})
				require.NoError(b, err)
				sides[i] = newBenchAppender(b, s, size, false)
			}
			var spent [3]time.Duration
			var steps [3][]time.Duration
			b.ResetTimer()
			for n := range b.N {
				for k := range sides { // rotate which side goes first
					i := (n + k) % len(sides)
					d := sides[i].step(b)
					spent[i] += d
					steps[i] = append(steps[i], d)
				}
			}
			var rate [3]float64
			for i := range rate {
				rate[i] = float64(b.N*size) / spent[i].Seconds()
			}
			b.ReportMetric(rate[0], "events/s-dbfence")
			b.ReportMetric(rate[1], "events/s-dbfence00012")
			b.ReportMetric(rate[2], "events/s-without")
			b.ReportMetric(rate[0]/rate[2], "ratio")
			b.ReportMetric(rate[1]/rate[2], "ratio00012")
			// Medians resist the machine's pauses better than totals do.
			var p50 [3]float64
			for i := range p50 {
				slices.Sort(steps[i])
				p50[i] = float64(steps[i][len(steps[i])/2])
			}
			b.ReportMetric(p50[2]/p50[0], "ratio-p50")
			b.ReportMetric(p50[2]/p50[1], "ratio00012-p50")
			b.StopTimer()
			for i := range 2 {
				pools[i].Close() // its sessions report their function statistics as they end
				b.ReportMetric(triggerMicros(b, dbs[i])/float64(b.N), []string{"trigger-µs/append", "trigger-µs/append-00012"}[i])
			}
		})
	}
}

// triggerMicros is the time the database fence's trigger functions spent
// in db, in microseconds, once the sessions that ran them have ended.
func triggerMicros(b testing.TB, db *dbtest.DB) float64 {
	b.Helper()
	var us float64
	require.Eventually(b, func() bool {
		err := db.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(self_time), 0) * 1000 FROM pg_stat_user_functions
			WHERE schemaname = 'ledger' AND funcname IN ('events_fence', 'heads_fence', 'event_ids_fence', 'heads_moved_from')`).Scan(&us)
		return err == nil && us > 0
	}, 10*time.Second, 50*time.Millisecond)
	return us
}

// dbName is the name of db's database.
func dbName(b testing.TB, db *dbtest.DB) string {
	b.Helper()
	var name string
	require.NoError(b, db.Pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&name))
	return name
}

// downOf is the Down half of migration file name.
func downOf(b testing.TB, name string) string {
	b.Helper()
	data, err := fs.ReadFile(migrations.FS(), name)
	require.NoError(b, err)
	_, down, ok := strings.Cut(string(data), "-- +goose Down")
	require.True(b, ok, "%s has no Down half", name)
	return down
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
