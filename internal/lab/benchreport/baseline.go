package benchreport

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// The baselines' SQL. They write to a scratch schema, ledger_bench, whose
// events table has ledger.events' columns and keeps ids and versions
// unique, and whose leases table holds one valid lease per partition.
var (
	sqlBenchSchema = []string{
		`DROP SCHEMA IF EXISTS ledger_bench CASCADE`,
		`CREATE SCHEMA ledger_bench`,
		// The ledger's leases, copied with their columns and keys.
		`CREATE TABLE ledger_bench.leases (LIKE ledger.leases INCLUDING ALL)`,
		// The ledger's events, with its columns, identity and checks, as
		// one plain table that keeps what the ledger promises of them
		// itself: ids unique, and one row per task and version. The
		// ledger keeps those with its heads and id tables beside a
		// partitioned log (migration 00006); the floor keeps them with
		// two unique indexes, the least an insert can do to keep them.
		`CREATE TABLE ledger_bench.events (LIKE ledger.events INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING CONSTRAINTS)`,
		`ALTER TABLE ledger_bench.events ADD PRIMARY KEY (seq), ADD UNIQUE (event_id), ADD UNIQUE (task_id, version)`,
	}
	sqlBenchLeases = `
INSERT INTO ledger_bench.leases (partition, holder, generation, expires_at, ttl_ms)
SELECT p, $1, 1, clock_timestamp() + interval '1 hour', 3600000 FROM generate_series(0, $2::int - 1) AS p`
	sqlBenchTruncate = `TRUNCATE ledger_bench.events RESTART IDENTITY`
	sqlBenchDrop     = `DROP SCHEMA IF EXISTS ledger_bench CASCADE`

	// sqlPerEventInsert is the fence predicate on one event: the row is
	// inserted only if the partition's lease shows the event's holder and
	// generation and has not expired by the database clock.
	sqlPerEventInsert = `
INSERT INTO ledger_bench.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
SELECT $1::text, $2::int, $3::text, $4::bigint, $5::text, $6::jsonb, $7::text, $8::bigint, clock_timestamp()
FROM ledger_bench.leases l
WHERE l.partition = $2::int AND l.holder = $7::text AND l.generation = $8::bigint AND l.expires_at > clock_timestamp()`

	// sqlSetInsert is the same predicate on a whole batch, joined from
	// unnest arrays: the bare minimum a fenced append must do.
	sqlSetInsert = `
INSERT INTO ledger_bench.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
SELECT i.event_id, i.partition, i.task_id, i.version, i.type, i.payload::jsonb, i.holder, i.generation, clock_timestamp()
FROM unnest($1::text[], $2::int[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::bigint[])
     AS i(event_id, partition, task_id, version, type, payload, holder, generation)
JOIN ledger_bench.leases l ON l.partition = i.partition
WHERE l.holder = i.holder AND l.generation = i.generation AND l.expires_at > clock_timestamp()`

	// sqlSchemaInsert is sqlSetInsert into the ledger's own tables: each
	// event's row in ledger.events, its id in ledger.event_ids and its
	// task's head in ledger.heads, all in one statement, as fence.Append's
	// insert writes them, but with nothing read or checked first (the
	// tasks are new, the leases the bench's own).
	sqlSchemaInsert = `
WITH ins AS (
    INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
    SELECT i.event_id, i.partition, i.task_id, i.version, i.type, i.payload::jsonb, i.holder, i.generation, clock_timestamp()
    FROM unnest($1::text[], $2::int[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::bigint[])
         AS i(event_id, partition, task_id, version, type, payload, holder, generation)
    JOIN ledger.leases l ON l.partition = i.partition
    WHERE l.holder = i.holder AND l.generation = i.generation AND l.expires_at > clock_timestamp()
    RETURNING event_id, seq, partition, task_id, version, type
),
ids AS (
    INSERT INTO ledger.event_ids (event_id, seq) SELECT event_id, seq FROM ins
),
heads AS (
    SELECT DISTINCT ON (task_id) task_id, partition, version, seq, type, min(seq) OVER w AS first_seq
    FROM ins WINDOW w AS (PARTITION BY task_id)
    ORDER BY task_id, version DESC
),
moved AS (
    INSERT INTO ledger.heads (task_id, partition, version, seq, type, first_seq, moved_from)
    SELECT task_id, partition, version, seq, type, first_seq, 0 FROM heads
    ON CONFLICT (task_id) DO UPDATE SET version = EXCLUDED.version, seq = EXCLUDED.seq, type = EXCLUDED.type,
                                        moved_from = ledger.heads.version
)
SELECT count(*) FROM ins`

	copyColumns = []string{"event_id", "partition", "task_id", "version", "type", "payload", "holder", "generation", "committed_at"}
)

// baselineHolder holds every lease of ledger_bench.leases, at generation 1.
const baselineHolder = "bench.baseline"

// baselines measures the raw inserts into ledger_bench and fence.Append
// into the ledger's own schema, each on one connection, batch after batch.
type baselines struct {
	pool *pgxpool.Pool
	o    Options
	id   string
	prog *progress
}

// createScratch creates the schema ledger_bench, which the baselines and
// the bare pipeline insert into, with every partition leased to
// baselineHolder for an hour; drop removes it.
func createScratch(ctx context.Context, pool *pgxpool.Pool) (drop func(), err error) {
	for _, q := range sqlBenchSchema {
		if _, err := pool.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("benchreport: create schema ledger_bench: %w", err)
		}
	}
	drop = func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, sqlBenchDrop)
	}
	if _, err := pool.Exec(ctx, sqlBenchLeases, baselineHolder, partitions); err != nil {
		drop()
		return nil, fmt.Errorf("benchreport: lease ledger_bench's partitions: %w", err)
	}
	return drop, nil
}

// run fills the four baseline rows of r; ledger_bench must exist.
func (b *baselines) run(ctx context.Context, r *Report) error {
	if err := b.raw(ctx, r); err != nil {
		return err
	}
	row, err := b.schemaInsert(ctx)
	if err != nil {
		return fmt.Errorf("benchreport: %s: %w", LabelSchemaInsert, err)
	}
	r.SchemaInsert = row
	if row, err = b.fenceAppend(ctx); err != nil {
		return fmt.Errorf("benchreport: %s: %w", LabelFenceAppend, err)
	}
	r.FenceAppend = row
	return nil
}

// schemaInsert measures sqlSchemaInsert: the set-based fenced insert into
// the ledger's own tables, new tasks, under 16 leases taken for the
// purpose and released afterwards.
func (b *baselines) schemaInsert(ctx context.Context) (Row, error) {
	store, err := fence.New(b.pool, fence.Config{})
	if err != nil {
		return Row{}, err
	}
	// The appends make ledger.events' partitions ahead of need; this
	// insert makes none, so it has them made first.
	if _, _, err := store.EnsurePartitions(ctx); err != nil {
		return Row{}, err
	}
	leases, err := acquireAll(ctx, store, wire.Holder("bench-"+b.id, "schema"))
	if err != nil {
		return Row{}, err
	}
	defer leases.release()
	events := newLoad("bench-"+b.id+"-schema-", taskCount(b.o.Events)).events(b.o.Events, leases.holder, leases.gens)
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return Row{}, fmt.Errorf("connect: %w", err)
	}
	defer conn.Release()
	return b.measure(LabelSchemaInsert, len(events), func(done func(int)) error {
		for _, s := range setBatches(events) {
			var n int
			if err := conn.QueryRow(ctx, sqlSchemaInsert, s.ids, s.parts, s.tasks, s.versions, s.types, s.payloads,
				s.holders, s.gens).Scan(&n); err != nil {
				return err
			}
			done(n)
		}
		return nil
	})
}

// raw runs the three inserts into ledger_bench, each on the same events
// and starting from an empty table.
func (b *baselines) raw(ctx context.Context, r *Report) error {
	var gens [partitions]int64
	for p := range gens {
		gens[p] = 1
	}
	events := newLoad("bench-"+b.id+"-raw-", taskCount(b.o.Events)).events(b.o.Events, baselineHolder, gens)
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("benchreport: connect: %w", err)
	}
	defer conn.Release()
	steps := []struct {
		row   *Row
		label string
		n     int
		do    func(context.Context, *pgx.Conn, []fence.Event, func(int)) error
	}{
		{&r.PerEventInsert, LabelPerEventInsert, b.o.perEventEvents(), perEventInsert},
		{&r.SetInsert, LabelSetInsert, b.o.Events, setInsert},
		{&r.Copy, LabelCopy, b.o.Events, copyInsert},
	}
	for _, s := range steps {
		if _, err := conn.Exec(ctx, sqlBenchTruncate); err != nil {
			return fmt.Errorf("benchreport: truncate ledger_bench.events: %w", err)
		}
		row, err := b.measure(s.label, s.n, func(done func(int)) error {
			return s.do(ctx, conn.Conn(), events[:s.n], done)
		})
		if err != nil {
			return fmt.Errorf("benchreport: %s: %w", s.label, err)
		}
		*s.row = row
	}
	return nil
}

// measure times do, which reports its progress through done, and shows
// the progress line meanwhile.
func (b *baselines) measure(label string, n int, do func(done func(int)) error) (Row, error) {
	var count atomic.Int64
	b.prog.begin(label, n, count.Load)
	defer b.prog.end()
	start := time.Now()
	if err := do(func(k int) { count.Add(int64(k)) }); err != nil {
		return Row{}, err
	}
	elapsed := time.Since(start)
	if got := count.Load(); got != int64(n) {
		return Row{}, fmt.Errorf("%d of %d events inserted: the fence refused the others", got, n)
	}
	return throughputRow(label, n, elapsed), nil
}

func perEventInsert(ctx context.Context, conn *pgx.Conn, events []fence.Event, done func(int)) error {
	for _, e := range events {
		tag, err := conn.Exec(ctx, sqlPerEventInsert, e.ID, e.Partition, e.Task, e.Version, e.Type,
			string(e.Payload), e.Holder, e.Generation)
		if err != nil {
			return err
		}
		done(int(tag.RowsAffected()))
	}
	return nil
}

// setBatch is one batch of sqlSetInsert's arrays.
type setBatch struct {
	ids, tasks, types, payloads, holders []string
	parts                                []int32
	versions, gens                       []int64
}

// setBatches splits events into batches of BatchSize, each as the arrays
// of a set-based insert.
func setBatches(events []fence.Event) []setBatch {
	var batches []setBatch
	for i := 0; i < len(events); i += BatchSize {
		var s setBatch
		for _, e := range events[i:min(i+BatchSize, len(events))] {
			s.add(e)
		}
		batches = append(batches, s)
	}
	return batches
}

func (s *setBatch) add(e fence.Event) {
	s.ids, s.tasks, s.types = append(s.ids, e.ID), append(s.tasks, e.Task), append(s.types, e.Type)
	s.payloads, s.holders = append(s.payloads, string(e.Payload)), append(s.holders, e.Holder)
	s.parts, s.versions, s.gens = append(s.parts, int32(e.Partition)), append(s.versions, e.Version), append(s.gens, e.Generation)
}

// executor is a connection or a pool.
type executor interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// insert runs sqlSetInsert on the batch and returns how many events the
// fence let in.
func (s *setBatch) insert(ctx context.Context, db executor) (int, error) {
	tag, err := db.Exec(ctx, sqlSetInsert, s.ids, s.parts, s.tasks, s.versions, s.types, s.payloads, s.holders, s.gens)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

func setInsert(ctx context.Context, conn *pgx.Conn, events []fence.Event, done func(int)) error {
	// Building the arrays is timed, as COPY's rows are: every client pays it.
	for _, s := range setBatches(events) {
		n, err := s.insert(ctx, conn)
		if err != nil {
			return err
		}
		done(n)
	}
	return nil
}

func copyInsert(ctx context.Context, conn *pgx.Conn, events []fence.Event, done func(int)) error {
	for i := 0; i < len(events); i += BatchSize {
		chunk := events[i:min(i+BatchSize, len(events))]
		rows := make([][]any, len(chunk))
		now := time.Now()
		for k, e := range chunk {
			rows[k] = []any{e.ID, e.Partition, e.Task, e.Version, e.Type, string(e.Payload), e.Holder, e.Generation, now}
		}
		n, err := conn.CopyFrom(ctx, pgx.Identifier{"ledger_bench", "events"}, copyColumns, pgx.CopyFromRows(rows))
		if err != nil {
			return err
		}
		done(int(n))
	}
	return nil
}

// fenceAppend measures the ledger's own append, every check included,
// into ledger.events under 16 leases taken for the purpose and released
// afterwards.
func (b *baselines) fenceAppend(ctx context.Context) (Row, error) {
	store, err := fence.New(b.pool, fence.Config{})
	if err != nil {
		return Row{}, err
	}
	leases, err := acquireAll(ctx, store, wire.Holder("bench-"+b.id, "append"))
	if err != nil {
		return Row{}, err
	}
	defer leases.release()
	holder, gens := leases.holder, leases.gens
	events := newLoad("bench-"+b.id+"-append-", taskCount(b.o.Events)).events(b.o.Events, holder, gens)
	return b.measure(LabelFenceAppend, len(events), func(done func(int)) error {
		for i := 0; i < len(events); i += BatchSize {
			res, err := store.Append(ctx, events[i:min(i+BatchSize, len(events))])
			if err != nil {
				return err
			}
			for _, r := range res {
				if r.Verdict != wire.VerdictCommitted {
					return fmt.Errorf("verdict %s/%s: %s", r.Verdict, r.Reason, r.Detail)
				}
			}
			done(len(res))
		}
		return nil
	})
}
