package ctl

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/benchreport"
)

// Bench runs the benchmark report ("bench"): the raw PostgreSQL baselines,
// fence.Append, the full ingest against a bare pipeline, the SDK pipeline,
// latency at a paced rate and the projector, in one run.
func Bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl bench", "[-only SECTIONS] [-events N] [-rounds N] [-rate N] [-duration D] [-workers N]",
		"Run the benchmark report in one process, on one machine: per-event fenced INSERT, set-based\n"+
			"fenced insert and COPY baselines and fence.Append (baselines); raw publishers into the full\n"+
			"ingest and into a bare pipeline in alternating rounds, with CPU time per event (pipeline);\n"+
			"publish → receipt latency at a paced rate through the raw path, the bare pipeline and the\n"+
			"SDK (latency); SDK workers → ingest → receipt and → projector KV (sdk); the projector's\n"+
			"catch-up and rebuild beside raw reads (projector). It uses DATABASE_URL when that answers\n"+
			"(point it at a scratch database), else a throwaway cluster. docs/benchmarks.md explains\n"+
			"every row.", stderr)
	only := f.String("only", "all", "sections to run, comma-separated: baselines, pipeline, latency, sdk, projector")
	events := f.Int("events", benchreport.EventsDefault, "events per throughput phase (and per pipeline round)")
	rounds := f.Int("rounds", benchreport.RoundsDefault, "alternating rounds of the full and the bare pipeline")
	rate := f.Int("rate", 0, "offered load of each latency path, events/s (0: half the full pipeline's saturation rate)")
	duration := f.Duration("duration", benchreport.LatencyDurationDefault, "length of each latency path")
	workers := f.Int("workers", benchreport.WorkersDefault, "SDK workers (each holds 16/workers partitions)")
	cpuProfile := f.String("cpuprofile", "", "write a CPU profile of the whole run (every part runs in this process) to this file")
	memProfile := f.String("memprofile", "", "write an allocation profile at the end of the run to this file")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	sections, err := benchreport.ParseSections(*only)
	if err != nil {
		return Usagef("-only: %v", err)
	}
	if *events < 1 || *rounds < 1 || *rate < 0 || *duration <= 0 || *workers < 1 || *workers > 16 {
		return Usagef("-events, -rounds and -duration must be positive, -rate 0 or more, -workers 1..16")
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	if *memProfile != "" {
		runtime.MemProfileRate = 64 << 10
		defer writeHeapProfile(*memProfile, stderr)
	}
	r, err := benchreport.Run(ctx, benchreport.Options{DatabaseURL: f.Conn.DatabaseURL, Only: sections, Events: *events,
		Rounds: *rounds, Rate: *rate, LatencyDuration: *duration, Workers: *workers, Progress: stderr})
	if err != nil {
		return err
	}
	if f.JSON {
		return writeJSON(stdout, r)
	}
	return r.Print(stdout)
}

// startCPUProfile profiles the process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

// writeHeapProfile writes the allocations since start ("alloc_space" in
// pprof) to path; a failure is reported, not fatal.
func writeHeapProfile(path string, stderr io.Writer) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		_ = f.Close()
	}
	if err != nil {
		fmt.Fprintf(stderr, "ledgerctl bench: memory profile: %v\n", err)
	}
}
