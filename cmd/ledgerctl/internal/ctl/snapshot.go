package ctl

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/wire"
)

// Snapshot writes the projection bucket to a file ("snapshot"), for a
// rebuild that starts from it rather than from all history.
func Snapshot(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl snapshot", "-out FILE",
		"Write every projection of the bucket "+wire.BucketTasks+" (each task's state with the version and seq\n"+
			"it reflects) to FILE, gzip JSON lines. 'ledgerctl rebuild -snapshot FILE' starts from it and\n"+
			"replays only the hot log, so take one before archiving the history the projections came from.\n"+
			"The projectors may keep running.", stderr)
	out := f.String("out", "", "the snapshot file to write (replaced atomically)")
	if err := f.Parse(args); err != nil {
		return err
	}
	switch {
	case f.NArg() > 0:
		return Usagef("unexpected argument %q", f.Arg(0))
	case *out == "":
		return Usagef("-out is required")
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, js, err := f.JetStream()
	if err != nil {
		return err
	}
	defer nc.Close()

	tmp, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	start := time.Now()
	h, tasks, skipped, err := projector.WriteSnapshot(ctx, js, pool, tmp)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return schemaHint("snapshot", err)
	}
	if err := os.Rename(tmp.Name(), *out); err != nil {
		return err
	}
	if f.JSON {
		return writeJSON(stdout, map[string]any{"file": *out, "tasks": tasks, "skipped": skipped,
			"taken_at": wire.FormatTime(h.TakenAt), "below_seq": h.BelowSeq, "seconds": time.Since(start).Seconds()})
	}
	fmt.Fprintf(stdout, "wrote %d projections to %s in %.1fs", tasks, *out, time.Since(start).Seconds())
	if skipped > 0 {
		fmt.Fprintf(stdout, " (%d values that are not projections of their key left out)", skipped)
	}
	fmt.Fprintln(stdout)
	return nil
}
