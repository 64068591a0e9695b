package ctl

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// archiveLine is one archived partition as archive prints it.
type archiveLine struct {
	Kind     string `json:"kind"` // "file"
	File     string `json:"file"`
	FromSeq  int64  `json:"from_seq"`
	BelowSeq int64  `json:"below_seq"`
	Rows     int64  `json:"rows"`
	Bytes    int64  `json:"bytes"`
	SHA256   string `json:"sha256,omitempty"`
}

// archiveSummary is the last line of archive's JSON output.
type archiveSummary struct {
	Kind      string  `json:"kind"` // "archive"
	DryRun    bool    `json:"dry_run"`
	Rows      int64   `json:"rows"`
	Seconds   float64 `json:"seconds"`
	BelowSeq  int64   `json:"below_seq"`
	IDFloor   string  `json:"id_floor"`
	IDFloorAt string  `json:"id_floor_at,omitempty"`
}

// Archive moves committed history older than a horizon out of the hot
// tables into files ("archive"): fence.Store.Archive does the work.
func Archive(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl archive", "-dir DIR (-before-seq N | -older-than D | -before TIME) [-dry-run]",
		"Move the partitions of ledger.events whose events are all older than the horizon into\n"+
			"gzip JSON-lines files in DIR, with a manifest (manifest.json), and drop them. Online:\n"+
			"appends go on meanwhile. A horizon inside the newest partitions is rounded down to a\n"+
			"partition's end. Run it as the owner of the ledger's schema (the role that migrates).\n"+
			"Events below the horizon are then answered as archived (docs/contract.md §3).", stderr)
	dir := f.String("dir", "", "directory for the files and the manifest (created if missing)")
	beforeSeq := f.Int64("before-seq", 0, "archive the partitions whose every seq is below this")
	olderThan := f.Duration("older-than", 0, "archive the partitions whose newest event committed longer ago than this (e.g. 720h)")
	before := f.String("before", "", "archive the partitions whose newest event committed before this time (RFC 3339)")
	dryRun := f.Bool("dry-run", false, "list what would be archived; change nothing")
	timeout := f.Duration("statement-timeout", fence.ArchiveStatementTimeoutDefault,
		"bound of each statement that reads, moves or drops a partition, set by the archive itself whatever the server's default")
	if err := f.Parse(args); err != nil {
		return err
	}
	opts := fence.ArchiveOptions{Dir: *dir, BeforeSeq: *beforeSeq, DryRun: *dryRun, StatementTimeout: *timeout}
	switch {
	case f.NArg() > 0:
		return Usagef("unexpected argument %q", f.Arg(0))
	case *dir == "":
		return Usagef("-dir is required")
	case *beforeSeq < 0:
		return Usagef("-before-seq must be positive, got %d", *beforeSeq)
	case *olderThan < 0:
		return Usagef("-older-than must be positive, got %v", *olderThan)
	case *olderThan > 0 && *before != "":
		return Usagef("give -older-than or -before, not both")
	case *olderThan > 0:
		opts.Before = time.Now().Add(-*olderThan)
	case *before != "":
		t, err := time.Parse(time.RFC3339Nano, *before)
		if err != nil {
			return Usagef("-before %q is not an RFC 3339 time", *before)
		}
		opts.Before = t
	}
	if opts.BeforeSeq == 0 && opts.Before.IsZero() {
		return Usagef("give a horizon: -before-seq, -older-than or -before")
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := fence.New(pool, fence.Config{})
	if err != nil {
		return err
	}
	start := time.Now()
	if !f.JSON {
		opts.Progress = func(p fence.ArchiveProgress) {
			fmt.Fprintf(stderr, "archive: %s (seq %d..%d) %s %s\n", p.Partition, p.FromSeq, p.BelowSeq-1, p.Step,
				time.Since(start).Round(time.Millisecond))
		}
	}
	rep, err := store.Archive(ctx, opts)
	if err != nil {
		return schemaHint("archive", err)
	}
	took := time.Since(start)
	if f.JSON {
		for _, file := range rep.Files {
			if err := writeJSON(stdout, archiveLine{Kind: "file", File: file.File, FromSeq: file.FromSeq,
				BelowSeq: file.BelowSeq, Rows: file.Rows, Bytes: file.Bytes, SHA256: file.SHA256}); err != nil {
				return err
			}
		}
		sum := archiveSummary{Kind: "archive", DryRun: *dryRun, Rows: rep.Rows, Seconds: took.Seconds(),
			BelowSeq: rep.Horizon.BelowSeq, IDFloor: rep.Horizon.IDFloor}
		if !rep.Horizon.IDFloorAt.IsZero() {
			sum.IDFloorAt = wire.FormatTime(rep.Horizon.IDFloorAt)
		}
		return writeJSON(stdout, sum)
	}
	return printArchive(stdout, *dryRun, rep, took)
}

func printArchive(w io.Writer, dryRun bool, rep fence.ArchiveReport, took time.Duration) error {
	switch {
	case len(rep.Files) == 0:
		fmt.Fprintf(w, "nothing to archive: no closed partition lies within the horizon (history is archived below seq %d)\n",
			rep.Horizon.BelowSeq)
		return nil
	case dryRun:
		fmt.Fprintf(w, "would archive %d partitions (seq %d..%d); nothing changed\n", len(rep.Files),
			rep.Files[0].FromSeq, rep.Files[len(rep.Files)-1].BelowSeq-1)
	default:
		fmt.Fprintf(w, "archived %d events from %d partitions in %.1fs; history below seq %d is archived, event ids minted before %s are no longer held\n",
			rep.Rows, len(rep.Files), took.Seconds(), rep.Horizon.BelowSeq, formatTime(rep.Horizon.IDFloorAt))
	}
	t := newTable(w, "FILE", "SEQ FROM", "SEQ TO", "ROWS", "BYTES")
	for _, file := range rep.Files {
		t.row(file.File, file.FromSeq, file.BelowSeq-1, file.Rows, file.Bytes)
	}
	return t.flush()
}
