package fence_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// BenchmarkGrowth measures how the append's cost depends on the ledger's
// age: fence.Append on a ledger grown to N events against the same append
// on an empty ledger, in alternating rounds of the same run. It runs only
// with LEDGER_GROWTH=1 (it fills tens of millions of rows; see
// docs/internals/benchmarks.md, "Growth"):
//
//	LEDGER_GROWTH=1 LEDGER_GROWTH_EVENTS=0,5000000,20000000 \
//	  go test -run '^$' -bench '^BenchmarkGrowth$' -benchtime 1x -timeout 4h ./pkg/fence
//
// The grown ledger is filled server-side (generate_series) in stages, one
// per size in LEDGER_GROWTH_EVENTS, and measured after each. Its history is
// shaped like live traffic: blocks of 100,000 tasks with random ids, each
// task advancing 10 versions, interleaved. The appends measured do the
// same to tasks of their own: 1,000 live tasks, each replaced by a new
// random id after 10 versions, batches of 500, ~200-byte payloads, 16
// partitions. The table and index sizes are logged at each stage.
func BenchmarkGrowth(b *testing.B) {
	if os.Getenv("LEDGER_GROWTH") == "" {
		b.Skip("set LEDGER_GROWTH=1 to fill a ledger of millions of events and measure the append on it")
	}
	sizes := growthSizes(b)
	rounds := growthEnvInt(b, "LEDGER_GROWTH_ROUNDS", 9)
	batches := growthEnvInt(b, "LEDGER_GROWTH_BATCHES", 60)
	ctx := context.Background()

	empty := newGrowthLedger(b)
	grown := newGrowthLedger(b)
	var filled int64
	for _, n := range sizes {
		if n > filled {
			start := time.Now()
			fillLedger(b, grown.db.Pool, filled, n)
			b.Logf("filled the grown ledger from %d to %d events in %v", filled, n, time.Since(start).Round(time.Second))
			filled = n
		}
		sz := ledgerSizes(b, grown.db.Pool)
		b.Logf("at %d events: %s", n, sz)

		var rateE, rateG []float64
		for r := range rounds {
			// Alternate which goes first, so drift of the shared machine
			// weighs on both alike.
			order := []*growthLedger{empty, grown}
			if r%2 == 1 {
				order = []*growthLedger{grown, empty}
			}
			for _, l := range order {
				rate := l.round(ctx, b, batches)
				if l == empty {
					rateE = append(rateE, rate)
				} else {
					rateG = append(rateG, rate)
				}
			}
		}
		ratios := make([]float64, rounds)
		for i := range ratios {
			ratios[i] = rateG[i] / rateE[i]
		}
		me, mg, mr := median(rateE), median(rateG), median(ratios)
		b.Logf("at %d events: append %.0f events/s on the grown ledger, %.0f on the empty one: ratio %.2f (median of %d rounds; rounds %s)",
			n, mg, me, mr, rounds, formatRatios(ratios))
		label := strconv.FormatInt(n/1_000_000, 10) + "M"
		if n < 1_000_000 {
			label = strconv.FormatInt(n, 10)
		}
		b.ReportMetric(mr, "ratio@"+label)
		b.ReportMetric(mg, "events/s@"+label)
		b.ReportMetric(me, "empty-events/s@"+label)
		b.ReportMetric(float64(sz.total())/(1<<20), "MiB@"+label)
	}
	if os.Getenv("LEDGER_GROWTH_ARCHIVE") != "" {
		archiveWhileAppending(b, grown, batches)
	}
}

// archiveWhileAppending archives the older half of the grown ledger with
// Store.Archive (what ledgerctl archive runs) while one appender keeps
// appending to it, and logs the archive's time, the rows it moved and the
// append rate during it against the rate just before.
func archiveWhileAppending(b *testing.B, l *growthLedger, batches int) {
	ctx := context.Background()
	var drawn int64
	require.NoError(b, l.db.Pool.QueryRow(ctx, `SELECT max(seq) FROM ledger.events`).Scan(&drawn))
	var before []float64
	for range 3 {
		before = append(before, l.round(ctx, b, batches))
	}
	var stop atomic.Bool
	var during []float64
	var appendErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			rate, err := l.roundErr(ctx, 10)
			if err != nil {
				appendErr = err
				return
			}
			during = append(during, rate)
		}
	}()
	start := time.Now()
	var steps []string
	rep, err := l.s.Archive(ctx, fence.ArchiveOptions{Dir: b.TempDir(), BeforeSeq: drawn / 2,
		Progress: func(p fence.ArchiveProgress) {
			steps = append(steps, fmt.Sprintf("%s %s at %v", p.Partition, p.Step, time.Since(start).Round(time.Second)))
		}})
	took := time.Since(start)
	stop.Store(true)
	<-done
	require.NoError(b, err)
	require.NoError(b, appendErr)
	var bytes int64
	for _, f := range rep.Files {
		bytes += f.Bytes
	}
	// The benchmark's log keeps only its first lines: what matters goes
	// into one line, and into metrics.
	b.Logf("archive of seq < %d: %d partitions, %d rows, %.0f MiB of files, in %v (%s); appends meanwhile %.0f events/s (median of %d rounds of 5,000), just before %.0f; after it %s",
		drawn/2, len(rep.Files), rep.Rows, float64(bytes)/(1<<20), took.Round(time.Second), strings.Join(steps, ", "),
		median(during), len(during), median(before), ledgerSizes(b, l.db.Pool))
	b.ReportMetric(took.Seconds(), "archive-s")
	b.ReportMetric(float64(rep.Rows), "archived-rows")
	b.ReportMetric(float64(bytes)/(1<<20), "archive-MiB")
	b.ReportMetric(median(during), "events/s-during-archive")
	b.ReportMetric(median(before), "events/s-before-archive")
	b.ReportMetric(median(during)/median(before), "rate-during-archive-ratio")
}

func growthSizes(b *testing.B) []int64 {
	spec := os.Getenv("LEDGER_GROWTH_EVENTS")
	if spec == "" {
		spec = "0,5000000,20000000"
	}
	var out []int64
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		require.NoError(b, err, "LEDGER_GROWTH_EVENTS")
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func growthEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, name)
	return n
}

// growthLedger is one ledger the benchmark appends to, with its live tasks.
type growthLedger struct {
	db     *dbtest.DB
	s      *fence.Store
	leases []fence.Lease
	tasks  []growthTask
	next   int
}

type growthTask struct {
	id      string
	version int64
}

const (
	growthPartitions = 16
	growthLive       = 1000 // live tasks of the appends measured
	growthVersions   = 10   // versions per task, in the fill and in the appends
	growthBatch      = 500
)

func newGrowthLedger(b *testing.B) *growthLedger {
	s, db := newStore(b, fence.Config{})
	l := &growthLedger{db: db, s: s, tasks: make([]growthTask, growthLive)}
	for p := range growthPartitions {
		lease, err := s.Acquire(context.Background(), p, fmt.Sprintf("bench.%d", p), fence.TTLMax)
		require.NoError(b, err)
		l.leases = append(l.leases, lease)
	}
	for i := range l.tasks {
		l.tasks[i] = growthTask{id: randomTask()}
	}
	return l
}

func randomTask() string {
	var r [10]byte
	_, _ = rand.Read(r[:])
	return "live-" + hex.EncodeToString(r[:])
}

// round appends batches of growthBatch events and returns events/s, the
// time in Append only. Leases are renewed first: a round may follow a long
// fill.
func (l *growthLedger) round(ctx context.Context, b *testing.B, batches int) float64 {
	rate, err := l.roundErr(ctx, batches)
	require.NoError(b, err)
	return rate
}

func (l *growthLedger) roundErr(ctx context.Context, batches int) (float64, error) {
	for i, lease := range l.leases {
		renewed, err := l.s.Renew(ctx, lease.Partition, lease.Holder, lease.Generation, fence.TTLMax)
		if errors.Is(err, fence.ErrLost) {
			// A fill outlasted the TTL: take the partition again.
			renewed, err = l.s.Acquire(ctx, lease.Partition, lease.Holder, fence.TTLMax)
		}
		if err != nil {
			return 0, err
		}
		l.leases[i] = renewed
	}
	filler := strings.Repeat("x", 150)
	batch := make([]fence.Event, growthBatch)
	var spent time.Duration
	for range batches {
		for i := range batch {
			t := &l.tasks[l.next%growthLive]
			l.next++
			if t.version == growthVersions {
				*t = growthTask{id: randomTask()}
			}
			t.version++
			lease := l.leases[int(wire.PartitionOf(t.id, growthPartitions))]
			batch[i] = fence.Event{ID: newID(), Partition: lease.Partition, Task: t.id, Version: t.version, Type: "progress",
				Payload: []byte(fmt.Sprintf(`{"step":%d,"note":%q}`, t.version, filler)),
				Holder:  lease.Holder, Generation: lease.Generation}
		}
		start := time.Now()
		res, err := l.s.Append(ctx, batch)
		spent += time.Since(start)
		if err != nil {
			return 0, err
		}
		for _, r := range res {
			if r.Verdict != wire.VerdictCommitted {
				return 0, fmt.Errorf("verdict %s/%s", r.Verdict, r.Reason)
			}
		}
	}
	return float64(batches*growthBatch) / spent.Seconds(), nil
}

// fillLedger adds the events from..to-1 of the grown ledger's history
// server-side. The secondary indexes are dropped first and built again
// after, which is several times faster than maintaining them row by row;
// the table is then vacuumed and analysed, so that autovacuum does not
// start during the rounds.
func fillLedger(b *testing.B, pool *pgxpool.Pool, from, to int64) {
	ctx := context.Background()
	var partitioned bool
	require.NoError(b, pool.QueryRow(ctx, `SELECT to_regclass('ledger.heads') IS NOT NULL`).Scan(&partitioned))
	restore := dropSecondaryIndexes(b, pool)
	const chunk = 1_000_000 // one block of tasks: no task spans two chunks
	for lo := from; lo < to; lo += chunk {
		hi := min(lo+chunk, to)
		sql := sqlGrowthFill
		if partitioned {
			// The partitions the chunk's rows go to, and the heads and ids
			// the appends would have written.
			_, err := pool.Exec(ctx, `SELECT ledger.ensure_partitions(
				coalesce(pg_sequence_last_value(pg_get_serial_sequence('ledger.events', 'seq')::regclass), 0) + $1)`, hi-lo)
			require.NoError(b, err)
			sql = sqlGrowthFillPartitioned
		}
		_, err := pool.Exec(ctx, sql, lo, hi, growthVersions)
		require.NoError(b, err, "fill events %d..%d", lo, hi)
	}
	restore()
	for _, table := range []string{"ledger.events", "ledger.heads", "ledger.event_ids"} {
		var exists bool
		require.NoError(b, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists))
		if exists {
			_, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+table)
			require.NoError(b, err)
		}
	}
}

// sqlGrowthFill inserts events $1..$2-1 of the fill: event g belongs to
// block g / (100,000 * $3), whose 100,000 tasks take $3 versions each,
// interleaved. Ids are ULID-shaped and rise with g, as ULIDs rise with
// time; task ids are random-looking, as real ones are.
const sqlGrowthFill = `
INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
SELECT '01H0' || lpad(upper(to_hex(g)), 22, '0'),
       t.n % 16, 'fill-' || left(md5(t.n::text), 20), t.v, 'progress',
       jsonb_build_object('step', t.v, 'note', repeat('x', 150)), 'fill.0', 1, clock_timestamp()
FROM generate_series($1::bigint, $2::bigint - 1) AS g
CROSS JOIN LATERAL (
    SELECT (g / (100000 * $3::bigint)) * 100000 + g % 100000 AS n,
           (g % (100000 * $3::bigint)) / 100000 + 1 AS v
) t`

// sqlGrowthFillPartitioned is sqlGrowthFill for the schema of migration
// 00006: the rows' ids go to ledger.event_ids and each task's head to
// ledger.heads, as the appends would have written them.
const sqlGrowthFillPartitioned = `
WITH ins AS (` + sqlGrowthFill + `
    RETURNING seq, event_id, task_id, partition, version
), ids AS (
    INSERT INTO ledger.event_ids (event_id, seq) SELECT event_id, seq FROM ins
)
INSERT INTO ledger.heads (task_id, partition, version, seq, type, first_seq)
SELECT task_id, partition, max(version), max(seq), 'progress', min(seq) FROM ins GROUP BY task_id, partition
ON CONFLICT (task_id) DO UPDATE SET version = excluded.version, seq = excluded.seq`

// dropSecondaryIndexes drops every index of ledger.events but its primary
// key, and returns a function that creates them again as they were.
func dropSecondaryIndexes(b *testing.B, pool *pgxpool.Pool) func() {
	ctx := context.Background()
	type constraint struct{ name, def string }
	rows, err := pool.Query(ctx, `
SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = 'ledger.events'::regclass AND contype = 'u'`)
	require.NoError(b, err)
	var cons []constraint
	for rows.Next() {
		var c constraint
		require.NoError(b, rows.Scan(&c.name, &c.def))
		cons = append(cons, c)
	}
	require.NoError(b, rows.Err())
	rows, err = pool.Query(ctx, `
SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = 'ledger.events'::regclass AND NOT x.indisprimary
  AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = x.indexrelid)`)
	require.NoError(b, err)
	var idx []constraint
	for rows.Next() {
		var c constraint
		require.NoError(b, rows.Scan(&c.name, &c.def))
		idx = append(idx, c)
	}
	require.NoError(b, rows.Err())
	for _, c := range cons {
		_, err := pool.Exec(ctx, `ALTER TABLE ledger.events DROP CONSTRAINT `+c.name)
		require.NoError(b, err)
	}
	for _, c := range idx {
		_, err := pool.Exec(ctx, `DROP INDEX ledger.`+c.name)
		require.NoError(b, err)
	}
	return func() {
		_, err := pool.Exec(ctx, `SET maintenance_work_mem = '512MB'`)
		require.NoError(b, err)
		for _, c := range cons {
			_, err := pool.Exec(ctx, `ALTER TABLE ledger.events ADD CONSTRAINT `+c.name+` `+c.def)
			require.NoError(b, err)
		}
		for _, c := range idx {
			// The index of a partitioned table is defined ON ONLY the
			// parent; made again on the parent, it is made on every
			// partition.
			_, err := pool.Exec(ctx, strings.Replace(c.def, " ON ONLY ", " ON ", 1))
			require.NoError(b, err)
		}
	}
}

// relSize is a table's heap and index sizes in bytes, partitions summed.
type relSize struct {
	name         string
	heap, index  int64
	rows         int64
	partitionsOf int64
}

type sizes []relSize

func (s sizes) total() int64 {
	var n int64
	for _, r := range s {
		n += r.heap + r.index
	}
	return n
}

func (s sizes) String() string {
	var parts []string
	for _, r := range s {
		parts = append(parts, fmt.Sprintf("%s %d rows (%d partitions): table %.0f MiB, indexes %.0f MiB",
			r.name, r.rows, r.partitionsOf, float64(r.heap)/(1<<20), float64(r.index)/(1<<20)))
	}
	return strings.Join(parts, "; ") + fmt.Sprintf("; total %.0f MiB", float64(s.total())/(1<<20))
}

// ledgerSizes reports the sizes of the ledger's tables that grow with its
// history, whichever of them the schema has.
func ledgerSizes(b *testing.B, pool *pgxpool.Pool) sizes {
	ctx := context.Background()
	var out sizes
	for _, name := range []string{"ledger.events", "ledger.heads", "ledger.event_ids"} {
		var exists bool
		require.NoError(b, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists))
		if !exists {
			continue
		}
		r := relSize{name: name}
		// reltuples is the estimate VACUUM (ANALYZE) left: counting 20 M
		// rows would take longer than the round it describes.
		require.NoError(b, pool.QueryRow(ctx, `
SELECT coalesce(sum(pg_relation_size(t.relid)), 0)::bigint, coalesce(sum(pg_indexes_size(t.relid)), 0)::bigint,
       count(*), coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint
FROM (SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf
      UNION SELECT $1::regclass WHERE (SELECT relkind FROM pg_class WHERE oid = $1::regclass) = 'r') t
JOIN pg_class c ON c.oid = t.relid`, name).
			Scan(&r.heap, &r.index, &r.partitionsOf, &r.rows))
		out = append(out, r)
	}
	return out
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func formatRatios(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strings.Join(parts, " ")
}
