package projector

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// scanChunk is how many events one scan query of a rebuild reads.
const scanChunk = 20_000

// Progress reports a rebuild's advance.
type Progress struct {
	// Done is how many events were replayed, of Total: the events of the
	// partitions when the rebuild began.
	Done, Total int64
	// Elapsed is the time since the scan began.
	Elapsed time.Duration
}

// ErrHistoryArchived is returned by a rebuild from the hot log alone when
// history was archived (ledgerctl archive): the projections would lack the
// archived versions. Rebuild from a snapshot, from the archive's files, or
// say that the hot log alone is wanted (RebuildSource).
var ErrHistoryArchived = errors.New("projector: rebuild: history is archived")

// RebuildSource says where a rebuild takes the history that is no longer
// in the hot log. The zero value is the hot log alone, refused once history
// was archived.
type RebuildSource struct {
	// Snapshot, if not nil, is a snapshot (WriteSnapshot): each projection
	// in it is where its task begins, and the hot log's later versions are
	// folded on. A task whose versions between the snapshot and the hot
	// log were archived is left waiting at that gap, and the rebuild says
	// so in its error.
	Snapshot io.Reader
	// ArchiveDir, if set, is an archive directory (ledgerctl archive): its
	// files, checked against their manifest, are replayed before the hot
	// log, a full replay. They must reach the current horizon.
	ArchiveDir string
	// HotOnly rebuilds from the hot log alone although history is
	// archived: tasks whose early versions are archived wait at a gap.
	HotOnly bool
	// StatementTimeout bounds each of the rebuild's scans of PostgreSQL,
	// set in the scan's own transaction whatever the server's default for
	// the role: default RebuildStatementTimeoutDefault.
	StatementTimeout time.Duration
}

// RebuildStatementTimeoutDefault is the default of
// RebuildSource.StatementTimeout: 10 minutes.
const RebuildStatementTimeoutDefault = 10 * time.Minute

// RebuildBucket is the scratch bucket a rebuild builds the projections in
// before it swaps them into ledger_tasks: ledger_tasks_rebuild.
const RebuildBucket = wire.BucketTasks + "_rebuild"

// Rebuild is RebuildFrom the hot log alone: it fails with
// ErrHistoryArchived, before changing anything, if history was archived.
func (s *Service) Rebuild(ctx context.Context, progress func(Progress)) error {
	return s.RebuildFrom(ctx, RebuildSource{}, progress)
}

// RebuildFrom replays the committed log into fresh projections of the
// service's partitions, then returns; Start afterwards resumes live
// consumption. It must run before Start, with no other projector running on
// the same partitions. It begins with the snapshot or the archive's files
// src names, if any, then replays the hot log (PostgreSQL).
//
// Nothing that commits meanwhile is lost: the consumer is recreated, at the
// log's current end, before the scan begins. An event committed before that
// is seen by the scan; one committed after has its log copy delivered to the
// new consumer; one seen by both is a duplicate to the engine.
//
// Readers never see fewer projections than before: the projections are
// built in a scratch bucket, and only once the rebuild succeeded is each
// copied over its task's value in ledger_tasks, and the consumer moved to
// where the scan began. A rebuild that fails leaves the bucket and the
// consumer as they were. Values of tasks the rebuild did not meet are left
// alone.
func (s *Service) RebuildFrom(ctx context.Context, src RebuildSource, progress func(Progress)) (err error) {
	if src.Snapshot != nil && src.ArchiveDir != "" {
		return errors.New("projector: rebuild: from a snapshot or from the archive, not both")
	}
	timeout := cmp.Or(src.StatementTimeout, RebuildStatementTimeoutDefault)
	var below, first int64
	if err := s.scanRow(ctx, timeout, sqlHorizon, nil, &below, &first); err != nil {
		return fmt.Errorf("projector: rebuild: read the archive horizon: %w", err)
	}
	if below > 1 && src.Snapshot == nil && src.ArchiveDir == "" && !src.HotOnly {
		return fmt.Errorf("%w below seq %d: rebuild from a snapshot or from the archive's files, or from the hot log alone knowingly", ErrHistoryArchived, below)
	}
	var manifest fence.Manifest
	if src.ArchiveDir != "" {
		m, err := fence.ReadManifest(src.ArchiveDir)
		if err != nil {
			return fmt.Errorf("projector: rebuild: %w", err)
		}
		if err := reachesHorizon(m, first, below); err != nil {
			return err
		}
		// Every file is checked before any row is applied, and before the
		// bucket is deleted: against its manifest, and the manifest
		// against the sums the ledger recorded as it archived.
		if err := s.archiveMatchesLedger(ctx, m); err != nil {
			return err
		}
		if _, err := fence.VerifyArchive(src.ArchiveDir); err != nil {
			return fmt.Errorf("projector: rebuild: %w", err)
		}
		manifest = m
	}
	logEnd, err := s.stage(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			s.unstage()
		}
	}()
	parts := s.cfg.partitionsOrAll()
	var total, last int64
	if err := s.scanRow(ctx, timeout, sqlScanCount, []any{parts}, &total, &last); err != nil {
		return fmt.Errorf("projector: rebuild: count: %w", err)
	}
	for _, f := range manifest.Files {
		total += f.Rows
	}
	r := &rebuild{s: s, timeout: timeout, parts: parts, mine: map[int]bool{}, seen: map[string]bool{}, total: total,
		start: time.Now(), progress: progress}
	for _, p := range parts {
		r.mine[int(p)] = true
	}
	switch {
	case src.Snapshot != nil:
		if err := r.loadSnapshot(ctx, src.Snapshot); err != nil {
			return err
		}
	case src.ArchiveDir != "":
		if err := r.replayArchive(ctx, src.ArchiveDir); err != nil {
			return err
		}
	}
	for cursor := int64(0); cursor < last; {
		n, next, err := r.chunk(ctx, cursor)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		cursor = next
		if err := r.advance(ctx, n); err != nil {
			return err
		}
	}
	if len(s.held) > 0 {
		return fmt.Errorf("projector: rebuild: the bucket refused the projections of %d tasks for lack of space (see ledger_projector_kv_refused_total); raise its max_bytes and rebuild again", len(s.held))
	}
	var after, ignored int64
	if err := s.scanRow(ctx, timeout, sqlHorizon, nil, &after, &ignored); err != nil {
		return fmt.Errorf("projector: rebuild: read the archive horizon: %w", err)
	}
	if after != below {
		// Rows moved out of the hot log after the rebuild planned where to
		// read them: it may have missed some.
		return fmt.Errorf("projector: rebuild: an archive moved the horizon from seq %d to %d during the rebuild; rebuild again", below, after)
	}
	copied, err := s.swap(ctx, logEnd)
	if err != nil {
		return err
	}
	s.log.Info("rebuild done", slog.Int("projections", copied), slog.Int64("events", r.done), slog.Int64("from_snapshot", r.loaded),
		slog.String("took", time.Since(r.start).String()))
	if below > 1 {
		return s.waitingOnArchived(ctx, below)
	}
	return nil
}

// rebuild is the progress of a rebuild.
type rebuild struct {
	s        *Service
	timeout  time.Duration   // of each scan
	parts    []int32         // the partitions rebuilt
	mine     map[int]bool    // the same, as a set
	seen     map[string]bool // tasks this rebuild has begun
	done     int64           // events replayed
	loaded   int64           // projections taken from a snapshot
	total    int64
	start    time.Time
	progress func(Progress)
}

func (r *rebuild) advance(ctx context.Context, n int) error {
	r.done += int64(n)
	if r.progress != nil {
		r.progress(Progress{Done: r.done, Total: r.total, Elapsed: time.Since(r.start)})
	}
	return ctx.Err()
}

// loadSnapshot writes the snapshot's projections of the service's
// partitions to the bucket, a chunk at a time; the hot log's scan then
// loads each task from there, as it loads a task it began itself. A value
// stored without its data cannot be folded on from, and is left out: its
// task starts from nothing.
func (r *rebuild) loadSnapshot(ctx context.Context, snap io.Reader) error {
	s := r.s
	changed := map[string]projection.State{}
	flush := func() error {
		if len(changed) == 0 {
			return nil
		}
		if !s.writeAll(ctx, changed) {
			return fmt.Errorf("projector: rebuild: write the snapshot's projections: %w", errOr(ctx.Err(), errors.New("stopped")))
		}
		for task := range changed {
			if s.held[task] == nil {
				delete(s.revs, task) // loaded again, with its revision, when the scan meets the task
			}
		}
		clear(changed)
		return nil
	}
	_, err := ReadSnapshot(snap, func(st projection.State) error {
		if !r.mine[st.Partition] || st.DataTooLarge != 0 || r.seen[st.Task] {
			return nil
		}
		if err := r.begin(ctx, st.Task); err != nil {
			return err
		}
		st.UpdatedAt = time.Now().UTC()
		changed[st.Task] = st
		r.loaded++
		if len(changed) == scanChunk {
			return flush()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("projector: rebuild: %w", err)
	}
	return flush()
}

// replayArchive replays the archive's files, checked against the
// manifest, a chunk at a time, as the hot log's scan does.
func (r *rebuild) replayArchive(ctx context.Context, dir string) error {
	var chunk []projection.Event
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		if err := r.markSnapshots(ctx, chunk); err != nil {
			return err
		}
		if err := r.events(ctx, chunk); err != nil {
			return err
		}
		n := len(chunk)
		chunk = chunk[:0]
		return r.advance(ctx, n)
	}
	_, err := fence.ReplayArchive(dir, func(c fence.Committed) error {
		if !r.mine[c.Partition] {
			return nil
		}
		chunk = append(chunk, eventOf(&c))
		if len(chunk) == scanChunk {
			return flush()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("projector: rebuild from the archive: %w", err)
	}
	return flush()
}

// markSnapshots marks the events of snapshot tasks, which the archive's
// files do not: ledger.heads keeps every task's kind.
func (r *rebuild) markSnapshots(ctx context.Context, chunk []projection.Event) error {
	seen := map[string]bool{}
	var tasks []string
	for _, ev := range chunk {
		if !seen[ev.Task] {
			seen[ev.Task] = true
			tasks = append(tasks, ev.Task)
		}
	}
	rows, err := r.s.pool.Query(ctx, sqlSnapshotTasks, tasks)
	if err != nil {
		return fmt.Errorf("projector: rebuild from the archive: kinds of %d tasks: %w", len(tasks), err)
	}
	snap, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("projector: rebuild from the archive: kinds of %d tasks: %w", len(tasks), err)
	}
	if len(snap) == 0 {
		return nil
	}
	is := map[string]bool{}
	for _, t := range snap {
		is[t] = true
	}
	for i := range chunk {
		chunk[i].Snapshot = is[chunk[i].Task]
	}
	return nil
}

// sqlArchivedSums lists what the ledger recorded of every archived
// partition: its seq range, rows and the SHA-256 sum of its file.
const sqlArchivedSums = `
SELECT lo, hi, coalesce(rows, 0), coalesce(sha256, '') FROM ledger.event_partitions
WHERE archived_at IS NOT NULL ORDER BY lo`

// archiveMatchesLedger checks an archive's manifest against
// ledger.event_partitions: each file the manifest names is a partition the
// ledger archived, with the same seq range, rows and SHA-256 sum, so a
// directory whose manifest was rewritten to fit altered files is refused.
func (s *Service) archiveMatchesLedger(ctx context.Context, m fence.Manifest) error {
	type sum struct {
		hi, rows int64
		sha256   string
	}
	recorded := map[int64]sum{}
	rows, err := s.pool.Query(ctx, sqlArchivedSums)
	if err != nil {
		return fmt.Errorf("projector: rebuild: read the archived partitions: %w", err)
	}
	var lo int64
	var r sum
	if _, err := pgx.ForEachRow(rows, []any{&lo, &r.hi, &r.rows, &r.sha256}, func() error {
		recorded[lo] = r
		return nil
	}); err != nil {
		return fmt.Errorf("projector: rebuild: read the archived partitions: %w", err)
	}
	for _, f := range m.Files {
		r, ok := recorded[f.FromSeq]
		switch {
		case !ok:
			return fmt.Errorf("projector: rebuild: archive file %s: the ledger archived no partition from seq %d", f.File, f.FromSeq)
		case r.hi != f.BelowSeq || r.rows != f.Rows:
			return fmt.Errorf("projector: rebuild: archive file %s: seq %d..%d with %d rows, the ledger archived seq %d..%d with %d rows",
				f.File, f.FromSeq, f.BelowSeq-1, f.Rows, f.FromSeq, r.hi-1, r.rows)
		case r.sha256 != f.SHA256:
			return fmt.Errorf("projector: rebuild: archive file %s: the manifest's SHA-256 %s is not the %s the ledger recorded", f.File, f.SHA256, r.sha256)
		}
	}
	return nil
}

// reachesHorizon checks that an archive's files cover the archived history
// without a hole: from the first partition, at first, to the horizon.
func reachesHorizon(m fence.Manifest, first, below int64) error {
	reach := first
	for _, f := range m.Files {
		if f.FromSeq != reach {
			return fmt.Errorf("projector: rebuild: the archive lacks seq %d..%d, before %s", reach, f.FromSeq-1, f.File)
		}
		reach = f.BelowSeq
	}
	if reach < below {
		return fmt.Errorf("projector: rebuild: the archive's files end at seq %d, but history below seq %d is archived: another directory holds the rest", reach, below)
	}
	return nil
}

// waitingOnArchived fails the rebuild, after it wrote what it could, if
// tasks wait at a gap whose versions are archived: it names a few.
func (s *Service) waitingOnArchived(ctx context.Context, below int64) error {
	var waiting []string
	for task := range s.gaps {
		waiting = append(waiting, task)
	}
	if len(waiting) == 0 {
		return nil
	}
	archived, err := s.archivedTasks(ctx, waiting)
	if err != nil {
		return err
	}
	if len(archived) == 0 {
		return nil
	}
	var names []string
	for task, first := range archived {
		if len(names) < 5 {
			names = append(names, fmt.Sprintf("%s (hot from version %d)", task, first))
		}
	}
	slices.Sort(names)
	return fmt.Errorf("%w below seq %d: %d tasks wait for versions that are archived and were not in the snapshot, e.g. %s; rebuild from the archive's files",
		ErrHistoryArchived, below, len(archived), strings.Join(names, ", "))
}

// archivedTasks returns, of tasks, those whose history is partly archived,
// with the first version the hot log holds.
func (s *Service) archivedTasks(ctx context.Context, tasks []string) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, sqlArchivedTasks, tasks)
	if err != nil {
		return nil, fmt.Errorf("projector: which tasks are archived: %w", err)
	}
	out := map[string]int64{}
	var task string
	var first int64
	_, err = pgx.ForEachRow(rows, []any{&task, &first}, func() error {
		out[task] = first
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: which tasks are archived: %w", err)
	}
	return out, nil
}

// reportArchivedRefetch logs, once per task, a re-fetch that found nothing
// because the versions it asks for are archived: the task waits at that
// gap until it is rebuilt from the archive.
func (s *Service) reportArchivedRefetch(ctx context.Context, due []projection.Refetch, events []projection.Event) {
	got := map[string]bool{}
	for _, ev := range events {
		got[ev.Task] = true
	}
	var empty []string
	for _, r := range due {
		if !got[r.Task] && !s.archivedWarned[r.Task] {
			empty = append(empty, r.Task)
		}
	}
	if len(empty) == 0 {
		return
	}
	archived, err := s.archivedTasks(ctx, empty)
	if err != nil {
		return
	}
	for _, r := range due {
		first, ok := archived[r.Task]
		if !ok || r.FromVersion >= first {
			continue
		}
		if s.archivedWarned == nil {
			s.archivedWarned = map[string]bool{}
		}
		s.archivedWarned[r.Task] = true
		s.log.Warn("a missing version is archived; the task waits at the gap until it is rebuilt from the archive (ledgerctl rebuild -archive)",
			slog.String("task", r.Task), slog.Int64("from_version", r.FromVersion), slog.Int64("first_hot_version", first))
	}
}

// stage prepares a rebuild: the buckets exist, an empty scratch bucket
// takes the writes, and the engine is empty. It returns the log's last
// seq: the consumer resumes after it once the rebuild swaps.
func (s *Service) stage(ctx context.Context) (uint64, error) {
	if err := s.prepare(ctx); err != nil {
		return 0, err
	}
	str, err := s.js.Stream(ctx, wire.StreamLog)
	if err != nil {
		return 0, fmt.Errorf("projector: rebuild: %s: %w", wire.StreamLog, err)
	}
	info, err := str.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("projector: rebuild: %s: %w", wire.StreamLog, err)
	}
	if err := s.js.DeleteKeyValue(ctx, RebuildBucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, fmt.Errorf("projector: rebuild: delete the scratch bucket left by an earlier rebuild: %w", err)
	}
	cfg, err := streams.Bucket(wire.BucketTasks, streams.Options{Prefix: s.cfg.Prefix, Replicas: s.cfg.Replicas})
	if err != nil {
		return 0, err
	}
	cfg.Bucket, cfg.Description = RebuildBucket, "ledger rebuild in progress: swapped into "+wire.BucketTasks+" when done"
	if s.cfg.TasksMaxBytes != 0 {
		cfg.MaxBytes = s.cfg.TasksMaxBytes
	}
	kv, err := s.js.CreateKeyValue(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("projector: rebuild: create the scratch bucket: %w", err)
	}
	s.kv, s.tasks = kv, RebuildBucket
	engine, err := projection.New(s.cfg.Engine)
	if err != nil {
		return 0, fmt.Errorf("projector: rebuild: %w", err)
	}
	s.engine, s.revs, s.gaps, s.held = engine, map[string]uint64{}, map[string]time.Time{}, map[string]*heldTask{}
	return info.State.LastSeq, nil
}

// unstage drops what a failed rebuild built: ledger_tasks and the
// consumer were not touched.
func (s *Service) unstage() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.js.DeleteKeyValue(ctx, RebuildBucket)
	if live, err := s.js.KeyValue(ctx, wire.BucketTasks); err == nil {
		s.kv, s.tasks = live, wire.BucketTasks
	}
	if engine, err := projection.New(s.cfg.Engine); err == nil {
		s.engine, s.revs, s.gaps, s.held = engine, map[string]uint64{}, map[string]time.Time{}, map[string]*heldTask{}
	}
}

// swapWindow is how many copies a swap has in flight.
const swapWindow = 512

// swap copies every value of the scratch bucket over its task's value in
// ledger_tasks, moves the consumer to the log's seq logEnd+1, and drops
// the scratch bucket. It returns how many values it copied.
func (s *Service) swap(ctx context.Context, logEnd uint64) (int, error) {
	w, err := s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return 0, fmt.Errorf("projector: rebuild: read the scratch bucket: %w", err)
	}
	defer w.Stop() //nolint:errcheck
	type copied struct {
		task string
		f    jetstream.PubAckFuture
	}
	var inFlight []copied
	settle := func() error {
		for _, c := range inFlight {
			select {
			case ack := <-c.f.Ok():
				s.revs[c.task] = ack.Sequence
			case err := <-c.f.Err():
				return fmt.Errorf("projector: rebuild: copy %s into %s: %w", c.task, wire.BucketTasks, err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		inFlight = inFlight[:0]
		return nil
	}
	n := 0
	for entry := range w.Updates() {
		if entry == nil {
			break // every value was delivered
		}
		m := nats.NewMsg("$KV." + wire.BucketTasks + "." + entry.Key())
		m.Data = entry.Value()
		f, err := s.js.PublishMsgAsync(m)
		if err != nil {
			return n, fmt.Errorf("projector: rebuild: copy %s into %s: %w", entry.Key(), wire.BucketTasks, err)
		}
		inFlight = append(inFlight, copied{entry.Key(), f})
		if n++; len(inFlight) == swapWindow {
			if err := settle(); err != nil {
				return n, err
			}
		}
	}
	if err := settle(); err != nil {
		return n, err
	}
	if err := ctx.Err(); err != nil {
		return n, err
	}
	if err := s.js.DeleteConsumer(ctx, wire.StreamLog, s.cfg.durable()); err != nil &&
		!errors.Is(err, jetstream.ErrConsumerNotFound) {
		return n, fmt.Errorf("projector: rebuild: delete consumer: %w", err)
	}
	if _, err := s.consumer(ctx, jetstream.DeliverNewPolicy, logEnd+1); err != nil {
		return n, err
	}
	live, err := s.js.KeyValue(ctx, wire.BucketTasks)
	if err != nil {
		return n, fmt.Errorf("projector: rebuild: %w", err)
	}
	s.kv, s.tasks = live, wire.BucketTasks
	if err := s.js.DeleteKeyValue(ctx, RebuildBucket); err != nil {
		s.log.Warn("the rebuild's scratch bucket was not deleted", slog.String("bucket", RebuildBucket), slog.String("error", err.Error()))
	}
	return n, nil
}

// scanRow reads one row in a read-only transaction of its own whose
// statements time out after timeout.
func (s *Service) scanRow(ctx context.Context, timeout time.Duration, sql string, args []any, dest ...any) error {
	return s.scan(ctx, timeout, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sql, args...).Scan(dest...) })
}

// scan runs fn in a read-only transaction whose statements time out after
// timeout (SET LOCAL), so that neither a provider's short default nor no
// bound at all decides how long a rebuild's scan may take.
func (s *Service) scan(ctx context.Context, timeout time.Duration, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlStatementTimeout, strconv.FormatInt(timeout.Milliseconds(), 10)); err != nil {
			return fmt.Errorf("set statement_timeout: %w", err)
		}
		return fn(tx)
	})
}

// chunk folds and stores the events after seq cursor, a chunk of them,
// and returns how many it read and the seq of the last one.
func (r *rebuild) chunk(ctx context.Context, cursor int64) (n int, last int64, err error) {
	var events []projection.Event
	err = r.s.scan(ctx, r.timeout, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlScan, cursor, r.parts, scanChunk)
		if err != nil {
			return err
		}
		events, err = scanEvents(rows)
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("projector: rebuild: scan after seq %d: %w", cursor, err)
	}
	if len(events) == 0 {
		return 0, cursor, nil
	}
	if err := r.events(ctx, events); err != nil {
		return 0, 0, err
	}
	return len(events), events[len(events)-1].Seq, nil
}

// events folds and stores a chunk of events in seq order.
func (r *rebuild) events(ctx context.Context, events []projection.Event) error {
	s := r.s
	changed := map[string]projection.State{}
	for _, ev := range events {
		if err := r.offer(ctx, ev, changed); err != nil {
			return err
		}
	}
	s.refetch(ctx, changed)
	if !s.writeAll(ctx, changed) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("projector: rebuild: write the projections up to seq %d: %w", events[len(events)-1].Seq, err)
		}
		return errors.New("projector: rebuild: stopped")
	}
	s.trim()
	return nil
}

// offer offers a scanned event. A task the rebuild has not begun starts
// from an empty state (its stored value, if any, is only overwritten); one
// it began, and trimmed since, is loaded from the bucket, where the rebuild
// wrote it.
func (r *rebuild) offer(ctx context.Context, ev projection.Event, changed map[string]projection.State) error {
	s := r.s
	if _, ok := s.engine.State(ev.Task); !ok {
		if r.seen[ev.Task] {
			if _, err := s.load(ctx, ev.Task, nil); err != nil {
				return fmt.Errorf("projector: rebuild: load %s: %w", ev.Task, err)
			}
		} else {
			if err := r.begin(ctx, ev.Task); err != nil {
				return fmt.Errorf("projector: rebuild: %w", err)
			}
			if err := s.engine.Load(projection.State{Task: ev.Task}); err != nil {
				return fmt.Errorf("projector: rebuild: begin %s: %w", ev.Task, err)
			}
		}
	}
	if err := s.offer(ctx, ev, changed, nil); err != nil {
		return fmt.Errorf("projector: rebuild: %w", err)
	}
	return nil
}

// begin marks task as begun by the rebuild, whose first write of it
// creates its value in the scratch bucket.
func (r *rebuild) begin(_ context.Context, task string) error {
	r.s.revs[task] = 0
	r.seen[task] = true
	return nil
}
