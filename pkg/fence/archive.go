package fence

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/oklog/ulid/v2"
)

// Archiving moves committed history out of the hot tables, a whole
// partition of ledger.events at a time, while appends go on (doc.go,
// Growth):
//
//  1. The partitions below the horizon asked for are chosen, oldest
//     first, each one whose every seq has been drawn.
//  2. ledger.horizon moves: below_seq to the end of the last chosen
//     partition, the id floor to the newest commit time among them. From
//     then on an append looks up every id minted before the floor, and the
//     insert refuses to record one (ledger.ids_check).
//  3. Each partition is detached CONCURRENTLY: PostgreSQL waits for every
//     transaction that holds a lock on ledger.events, so no row of it is
//     still on its way, and appends are not blocked.
//  4. Its rows are written to a file, read back and checked against the
//     table, and the manifest is rewritten to list the file.
//  5. The ids of its rows minted before the floor leave ledger.event_ids,
//     and the table is dropped in the transaction that records the file in
//     ledger.event_partitions.
//
// Every step can be repeated: a run that stopped half way is finished by
// the next, before it archives anything more.
//
// What an append consults, and why its cost does not grow with the
// ledger's age:
//
//   - ledger.heads, one row per task ever committed: dense versions and
//     pinning, for archived history too. One primary-key probe per task.
//   - ledger.event_ids, one row per id of the hot log: idempotence by id.
//     Ids are ULIDs, which rise with time, so its index grows at the right.
//   - ledger.events, partitioned by seq range (ledger.partitioning, default
//     4,194,304 rows): an insert touches the newest partition's index. A
//     task's rows are looked up between its first_seq and seq, so only the
//     partitions it spans are searched. Appends make partitions ahead of
//     need (partitions.go); a missing one is made at once, never a verdict.
//   - ledger.horizon: every row with seq < below_seq is archived, and every
//     id minted before id_floor (a ULID's first 10 characters, its time).
//
// Archived history keeps every promise but one, which it bounds. A version
// at or below a task's head is still taken. If its row is archived its
// content can no longer be compared: the event is a conflict (archived),
// recorded. An id not in the hot log and minted before the floor may have
// been archived: it is invalid (before_horizon), never committed. So an id
// minted at or after the floor is recognised for ever, and one minted
// before it while its row is hot. No id commits twice either way, and the
// floor only rises.
//
// Why an append never commits an archived id, in any order of events: the
// archive raises the floor (step 2) before it removes an id (step 5). The
// insert refuses an id minted before the floor it reads (ledger.ids_check),
// and the batch is decided again. An insert that began before the floor
// rose holds a lock on ledger.events until it commits. The detach (step 3)
// waits for it, so that insert met the id still in ledger.event_ids.

// ArchiveOptions says what Archive moves out of the hot log. At least one
// of BeforeSeq and Before is required; with both, a partition must pass
// both.
type ArchiveOptions struct {
	// Dir is where the files and the manifest go; it is created if missing.
	Dir string
	// BeforeSeq archives the partitions whose every seq is below it.
	BeforeSeq int64
	// Before archives the partitions whose newest row (by seq) was
	// committed before it.
	Before time.Time
	// DryRun reports what would be archived and changes nothing.
	DryRun bool
	// Progress, if set, is called as each partition is archived.
	Progress func(ArchiveProgress)
	// StatementTimeout bounds each statement that reads, moves or drops
	// a partition, set in the statement's own transaction whatever the
	// server's default for the role: default
	// ArchiveStatementTimeoutDefault. The detach, which PostgreSQL runs
	// outside any transaction, is bounded by the server's default alone;
	// an interrupted one is finished by the next run.
	StatementTimeout time.Duration
}

// ArchiveStatementTimeoutDefault is the default of
// ArchiveOptions.StatementTimeout: 1 hour.
const ArchiveStatementTimeoutDefault = time.Hour

// ArchiveProgress is a step of an archive.
type ArchiveProgress struct {
	// Partition is the partition's table, FromSeq and BelowSeq its range.
	Partition         string
	FromSeq, BelowSeq int64
	// Step is "detached", "written" or "dropped".
	Step string
	// Rows is how many rows the partition held (once written).
	Rows int64
}

// ArchiveReport is what Archive did.
type ArchiveReport struct {
	// Files are the partitions archived by this call, in seq order.
	Files []ManifestFile
	// Horizon is ledger.horizon afterwards.
	Horizon ManifestHorizon
	// Rows is the total of Files' rows.
	Rows int64
}

// archiveCandidate is a partition of ledger.events that may be archived.
type archiveCandidate struct {
	lo, hi int64
	name   string
	newest *time.Time // committed_at of its highest seq; nil if empty or detached
}

// Archive moves the partitions of ledger.events below the horizon asked for
// out of the hot tables into files in opts.Dir, with a manifest, and drops
// them; appends go on meanwhile. It must run as the owner of the ledger's
// schema (the role that migrates). It returns what it archived, which is
// nothing when no partition qualifies: the newest partition, the one still
// drawing seqs, never does.
func (s *Store) Archive(ctx context.Context, opts ArchiveOptions) (ArchiveReport, error) {
	var rep ArchiveReport
	if opts.BeforeSeq <= 0 && opts.Before.IsZero() {
		return rep, errors.New("fence: archive: give a horizon: a seq, a time or both")
	}
	if opts.Dir == "" {
		return rep, errors.New("fence: archive: no directory given")
	}
	opts.StatementTimeout = cmp.Or(opts.StatementTimeout, ArchiveStatementTimeoutDefault)
	cands, z, err := s.archiveCandidates(ctx, opts)
	if err != nil {
		return rep, err
	}
	if opts.DryRun || len(cands) == 0 {
		for _, c := range cands {
			rep.Files = append(rep.Files, ManifestFile{File: archiveFileName(c.lo, c.hi), FromSeq: c.lo, BelowSeq: c.hi})
		}
		rep.Horizon = z
		return rep, nil
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return rep, fmt.Errorf("fence: archive: %w", err)
	}
	if rep.Horizon, err = s.moveHorizon(ctx, cands, opts.StatementTimeout); err != nil {
		return rep, err
	}
	for _, c := range cands {
		f, err := s.archivePartition(ctx, opts, c, rep.Horizon)
		if err != nil {
			return rep, err
		}
		rep.Files = append(rep.Files, f)
		rep.Rows += f.Rows
	}
	return rep, nil
}

// archiveCandidates chooses the partitions to archive, oldest first: those
// a stopped run left below the horizon, then every closed partition within
// the horizon asked for, up to the first that is not.
func (s *Store) archiveCandidates(ctx context.Context, opts ArchiveOptions) ([]archiveCandidate, ManifestHorizon, error) {
	var z ManifestHorizon
	var floorAt *time.Time
	if err := s.pool.QueryRow(ctx, sqlArchiveHorizon).Scan(&z.BelowSeq, &z.IDFloor, &floorAt); err != nil {
		return nil, z, fmt.Errorf("fence: archive: read the horizon: %w", err)
	}
	if floorAt != nil {
		z.IDFloorAt = *floorAt
	}
	var drawn int64
	if err := s.pool.QueryRow(ctx, sqlArchiveDrawn).Scan(&drawn); err != nil {
		return nil, z, fmt.Errorf("fence: archive: read the newest seq: %w", err)
	}
	rows, err := s.pool.Query(ctx, sqlArchivePartitions)
	if err != nil {
		return nil, z, fmt.Errorf("fence: archive: list the partitions: %w", err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (archiveCandidate, error) {
		var c archiveCandidate
		return c, r.Scan(&c.lo, &c.hi, &c.name, &c.newest)
	})
	if err != nil {
		return nil, z, fmt.Errorf("fence: archive: list the partitions: %w", err)
	}
	var out []archiveCandidate
	for _, c := range all {
		switch {
		case c.lo < z.BelowSeq: // left by a run that stopped
		case c.hi-1 > drawn: // still drawing seqs
			return out, z, nil
		case opts.BeforeSeq > 0 && c.hi > opts.BeforeSeq:
			return out, z, nil
		case !opts.Before.IsZero() && c.newest != nil && !c.newest.Before(opts.Before):
			return out, z, nil
		}
		out = append(out, c)
	}
	return out, z, nil
}

// moveHorizon raises ledger.horizon over the candidates: below_seq to the
// end of the last, the id floor to the newest commit time among them (it
// never falls).
func (s *Store) moveHorizon(ctx context.Context, cands []archiveCandidate, timeout time.Duration) (ManifestHorizon, error) {
	var z ManifestHorizon
	below := cands[len(cands)-1].hi
	var floorAt time.Time
	for _, c := range cands {
		if c.newest != nil && c.newest.After(floorAt) {
			floorAt = *c.newest
		}
	}
	var prefix string
	if !floorAt.IsZero() {
		prefix = ulidPrefix(floorAt)
	}
	var at *time.Time
	err := s.timed(ctx, timeout, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sqlArchiveMoveHorizon, below, prefix, nullTime(floorAt)).Scan(&z.BelowSeq, &z.IDFloor, &at)
	})
	if err != nil {
		return z, fmt.Errorf("fence: archive: move the horizon to seq %d: %w", below, err)
	}
	if at != nil {
		z.IDFloorAt = *at
	}
	return z, nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// ulidPrefix is the first 10 characters of a ULID minted at t: its time.
func ulidPrefix(t time.Time) string {
	var u ulid.ULID
	_ = u.SetTime(ulid.Timestamp(t))
	return u.String()[:10]
}

// archivePartition detaches, writes, checks and drops one partition.
func (s *Store) archivePartition(ctx context.Context, opts ArchiveOptions, c archiveCandidate, z ManifestHorizon) (ManifestFile, error) {
	progress := func(step string, rows int64) {
		if opts.Progress != nil {
			opts.Progress(ArchiveProgress{Partition: c.name, FromSeq: c.lo, BelowSeq: c.hi, Step: step, Rows: rows})
		}
	}
	table := pgx.Identifier{"ledger", c.name}.Sanitize()
	var f ManifestFile
	var err error
	if s.hooks.archiveCopyFirst {
		// The negative control: the rows are read before the detach has
		// waited for the transactions still writing them.
		if f, err = s.writePartition(ctx, opts, c, table); err != nil {
			return f, err
		}
	}
	if err := s.detach(ctx, c, table); err != nil {
		return ManifestFile{}, err
	}
	progress("detached", 0)
	if !s.hooks.archiveCopyFirst {
		if f, err = s.writePartition(ctx, opts, c, table); err != nil {
			return f, err
		}
	}
	progress("written", f.Rows)
	m, err := ReadManifest(opts.Dir)
	if err != nil {
		return f, err
	}
	kept := m.Files[:0]
	for _, old := range m.Files {
		if old.FromSeq != f.FromSeq {
			kept = append(kept, old)
		}
	}
	m.Files, m.Horizon = append(kept, f), z
	if err := writeManifest(opts.Dir, m); err != nil {
		return f, fmt.Errorf("fence: archive: write the manifest: %w", err)
	}
	if err := s.dropArchived(ctx, opts.StatementTimeout, c, table, f, z); err != nil {
		return f, err
	}
	progress("dropped", f.Rows)
	return f, nil
}

// detach detaches the partition CONCURRENTLY, or finishes a detach that
// was interrupted; a partition already detached is left as it is.
func (s *Store) detach(ctx context.Context, c archiveCandidate, table string) error {
	var attached, pending bool
	if err := s.pool.QueryRow(ctx, sqlArchivePartitionState, c.name).Scan(&attached, &pending); err != nil {
		return fmt.Errorf("fence: archive: state of partition %s: %w", c.name, err)
	}
	var sql string
	switch {
	case pending:
		sql = `ALTER TABLE ledger.events DETACH PARTITION ` + table + ` FINALIZE`
	case attached:
		sql = `ALTER TABLE ledger.events DETACH PARTITION ` + table + ` CONCURRENTLY`
	default:
		return nil
	}
	if _, err := s.pool.Exec(ctx, sql); err != nil {
		return fmt.Errorf("fence: archive: detach partition %s: %w", c.name, err)
	}
	return nil
}

// writePartition writes the detached partition's rows to its file through
// a temporary file, then reads the file back and checks it against the
// table: every row, in seq order, within the range, as many as the table
// holds.
func (s *Store) writePartition(ctx context.Context, opts ArchiveOptions, c archiveCandidate, table string) (ManifestFile, error) {
	dir := opts.Dir
	f := ManifestFile{File: archiveFileName(c.lo, c.hi), FromSeq: c.lo, BelowSeq: c.hi}
	tmp, err := os.CreateTemp(dir, "."+f.File+".*")
	if err != nil {
		return f, fmt.Errorf("fence: archive: %w", err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	counter := &countingWriter{w: io.MultiWriter(tmp, h)}
	gz, err := gzip.NewWriterLevel(counter, gzip.BestSpeed)
	if err != nil {
		tmp.Close()
		return f, err
	}
	var buf bytes.Buffer
	var row Committed
	var payload string
	lost := !s.hooks.archiveLoseRow
	err = s.timed(ctx, opts.StatementTimeout, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT seq, event_id, partition, task_id, version, type, payload::text, holder, generation, committed_at
FROM `+table+` ORDER BY seq`)
		if err != nil {
			return fmt.Errorf("read partition %s: %w", c.name, err)
		}
		_, err = pgx.ForEachRow(rows, []any{&row.Seq, &row.EventID, &row.Partition, &row.Task, &row.Version, &row.Type,
			&payload, &row.Holder, &row.Generation, &row.CommittedAt}, func() error {
			row.Payload = []byte(payload)
			if !lost {
				lost = true // the negative control: the first row goes missing
				return nil
			}
			buf.Reset()
			if err := encodeArchiveLine(&buf, &row); err != nil {
				return fmt.Errorf("encode row %d: %w", row.Seq, err)
			}
			if _, err := gz.Write(buf.Bytes()); err != nil {
				return err
			}
			if f.Rows == 0 {
				f.FirstCommittedAt = row.CommittedAt
			}
			f.Rows++
			f.LastCommittedAt = row.CommittedAt
			return nil
		})
		return err
	})
	if err == nil {
		err = gz.Close()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return f, fmt.Errorf("fence: archive: write partition %s to %s: %w", c.name, f.File, err)
	}
	f.Bytes, f.SHA256 = counter.n, hex.EncodeToString(h.Sum(nil))
	if err := os.Rename(tmp.Name(), filepath.Join(dir, f.File)); err != nil {
		return f, fmt.Errorf("fence: archive: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return f, fmt.Errorf("fence: archive: %w", err)
	}
	var inTable int64
	if err := s.timed(ctx, opts.StatementTimeout, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&inTable)
	}); err != nil {
		return f, fmt.Errorf("fence: archive: count partition %s: %w", c.name, err)
	}
	if err := s.checkWritten(dir, f, inTable); err != nil {
		return f, err
	}
	f.ArchivedAt = time.Now().UTC()
	return f, nil
}

// checkWritten reads a written file back: it must decode, match its sum,
// and hold the table's rows.
func (s *Store) checkWritten(dir string, f ManifestFile, inTable int64) error {
	if s.hooks.archiveUnchecked || s.hooks.archiveCopyFirst {
		return nil
	}
	if f.Rows != inTable {
		return fmt.Errorf("fence: archive: %s holds %d rows, the partition %d", f.File, f.Rows, inTable)
	}
	if err := replayFile(dir, f, nil); err != nil {
		return fmt.Errorf("fence: archive: reading back: %w", err)
	}
	return nil
}

// dropArchived removes the archived partition's ids minted before the
// floor from ledger.event_ids (in slices, so that no transaction holds
// millions of row locks), then records the file and drops the table in one
// transaction.
func (s *Store) dropArchived(ctx context.Context, timeout time.Duration, c archiveCandidate, table string, f ManifestFile, z ManifestHorizon) error {
	const slice = 50_000
	for lo := c.lo; lo < c.hi; lo += slice {
		if err := s.timed(ctx, timeout, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM ledger.event_ids x USING `+table+` e
WHERE e.seq >= $1 AND e.seq < $2 AND x.event_id = e.event_id AND upper(left(x.event_id, 10)) < $3`,
				lo, min(lo+slice, c.hi), z.IDFloor)
			return err
		}); err != nil {
			return fmt.Errorf("fence: archive: remove the ids of partition %s: %w", c.name, err)
		}
	}
	err := s.timed(ctx, timeout, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlArchiveRecord, c.lo, f.Rows, f.File, f.SHA256, f.Bytes,
			nullTime(f.FirstCommittedAt), nullTime(f.LastCommittedAt)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DROP TABLE `+table)
		return err
	})
	if err != nil {
		return fmt.Errorf("fence: archive: drop partition %s: %w", c.name, err)
	}
	return nil
}

// archiveFileName is the file of the partition [lo, hi).
func archiveFileName(lo, hi int64) string {
	return fmt.Sprintf("events-%019d-%019d.jsonl.gz", lo, hi-1)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// timed runs fn in a transaction whose statements time out after timeout
// (SET LOCAL): a long operation sets its own bound rather than take the
// server's default for the role, short or none.
func (s *Store) timed(ctx context.Context, timeout time.Duration, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLocalStatementTimeout, ms(timeout)); err != nil {
			return fmt.Errorf("set statement_timeout: %w", err)
		}
		return fn(tx)
	})
}
