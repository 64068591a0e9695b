package ctl

import (
	"context"
	"io"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/benchreport"
)

// Bench runs the benchmark report ("bench"): the raw PostgreSQL baselines,
// fence.Append, the full pipeline and latency at a fixed load, in one run.
func Bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl bench", "[-events N] [-rate N] [-duration D] [-workers N]",
		"Run the benchmark report in one process: per-event fenced INSERT, set-based fenced insert\n"+
			"and COPY baselines, fence.Append, the full pipeline (SDK workers → ingest → projector),\n"+
			"and publish → receipt / publish → KV latency at a fixed offered load. It uses\n"+
			"DATABASE_URL when that answers (point it at a scratch database), else a throwaway cluster.", stderr)
	events := f.Int("events", benchreport.EventsDefault, "events per throughput phase")
	rate := f.Int("rate", benchreport.RateDefault, "offered load of the latency phase, events/s")
	duration := f.Duration("duration", benchreport.LatencyDurationDefault, "length of the latency phase")
	workers := f.Int("workers", benchreport.WorkersDefault, "SDK workers (each holds 16/workers partitions)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	if *events < 1 || *rate < 1 || *duration <= 0 || *workers < 1 || *workers > 16 {
		return Usagef("-events, -rate and -duration must be positive, -workers 1..16")
	}
	r, err := benchreport.Run(ctx, benchreport.Options{DatabaseURL: f.Conn.DatabaseURL, Events: *events, Rate: *rate,
		LatencyDuration: *duration, Workers: *workers, Progress: stderr})
	if err != nil {
		return err
	}
	if f.JSON {
		return writeJSON(stdout, r)
	}
	return r.Print(stdout)
}
