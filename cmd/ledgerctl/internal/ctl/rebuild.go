package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/wire"
)

// Rebuild replays the PostgreSQL log into fresh projections ("rebuild").
// The projectors of those partitions must be stopped first; started again
// afterwards, they resume from the consumer the rebuild recreated at the
// log's end before it began, so nothing committed meanwhile is lost.
func Rebuild(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl rebuild", "[-partitions SET]",
		"Replay the committed log from PostgreSQL into fresh projections in ledger_tasks.\n"+
			"Stop the projectors of these partitions first and start them again afterwards:\n"+
			"they resume from where the rebuild began, so nothing committed meanwhile is lost.", stderr)
	parts := f.String("partitions", "all", `partitions to rebuild: "all", or like "0-7" or "1,3"`)
	count := f.Int("partition-count", wire.PartitionsDefault, "partition count N")
	replicas := f.Int("replicas", 1, "bucket replicas if the bucket is created")
	snapshot := f.String("snapshot", "", "start from this snapshot (ledgerctl snapshot), then replay the hot log")
	archive := f.String("archive", "", "replay this archive directory's files (ledgerctl archive) before the hot log")
	hotOnly := f.Bool("hot-only", false, "replay the hot log alone although history is archived")
	timeout := f.Duration("statement-timeout", projector.RebuildStatementTimeoutDefault,
		"bound of each scan of PostgreSQL, set by the rebuild itself whatever the server's default")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	if *snapshot != "" && *archive != "" {
		return Usagef("give -snapshot or -archive, not both")
	}
	src := projector.RebuildSource{ArchiveDir: *archive, HotOnly: *hotOnly, StatementTimeout: *timeout}
	if *snapshot != "" {
		file, err := os.Open(*snapshot)
		if err != nil {
			return err
		}
		defer file.Close()
		src.Snapshot = file
	}
	set, err := projector.ParsePartitions(*parts, *count)
	if err != nil {
		return Usagef("%v", err)
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, err := f.NATS()
	if err != nil {
		return err
	}
	defer nc.Close()
	p, err := projector.New(projector.Config{Prefix: f.Prefix, PartitionCount: *count, Partitions: set, Replicas: *replicas},
		projector.Deps{NC: nc, Pool: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	var last projector.Progress
	err = p.RebuildFrom(ctx, src, func(pr projector.Progress) {
		last = pr
		pct := 100.0
		if pr.Total > 0 {
			pct = 100 * float64(pr.Done) / float64(pr.Total)
		}
		fmt.Fprintf(stderr, "\rrebuild: %d/%d events (%.0f%%), %.0f events/s   ", pr.Done, pr.Total, pct,
			float64(pr.Done)/max(pr.Elapsed.Seconds(), 1e-9))
	})
	if last.Done > 0 {
		fmt.Fprintln(stderr)
	}
	if errors.Is(err, projector.ErrHistoryArchived) {
		return fmt.Errorf("%w (-snapshot FILE, -archive DIR, or -hot-only)", err)
	}
	if err != nil {
		return err
	}
	if f.JSON {
		return writeJSON(stdout, map[string]any{"events": last.Done, "seconds": last.Elapsed.Seconds()})
	}
	fmt.Fprintf(stdout, "rebuilt %d events in %.1fs; start the projectors again to resume live\n", last.Done, last.Elapsed.Seconds())
	return nil
}
