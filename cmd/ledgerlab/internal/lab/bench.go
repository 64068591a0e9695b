package lab

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"

	"github.com/flowness/ledger/internal/admin"
	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/lab/benchreport"
)

// Bench runs the benchmark report ("bench"): the raw PostgreSQL baselines,
// fence.Append, the full ingest against a bare pipeline, the SDK pipeline,
// latency at a paced rate and the projector, in one run.
func Bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// "bench worker" is a process an external run starts, not a command
	// of its own.
	if len(args) > 0 && args[0] == "worker" {
		return benchWorker(ctx, args[1:], stdout, stderr)
	}
	f := NewFlags("ledgerlab bench", "[-only SECTIONS] [-events N] [-rounds N] [-rate N] [-duration D] [-workers N]\n"+
		"       ledgerlab bench -external [-events N] [-tasks N] [-workers N] [-warmup N] [-raw | -compare N] [-log-batches] [-roles] [-bin DIR] [-ingest-profile FILE] [-projector-profile FILE] [-nats-profile FILE] [-worker-profile FILE]\n"+
		"       ledgerlab bench -external -latency [-rate N] [-events N] [-workers N] [-warmup N] [-raw] [-roles] [-bin DIR]",
		"Run the benchmark report in one process, on one machine: per-event fenced INSERT, set-based\n"+
			"fenced insert and COPY baselines and fence.Append (baselines); raw publishers into the full\n"+
			"ingest and into a bare pipeline in alternating rounds, with CPU time per event (pipeline);\n"+
			"publish → receipt latency at a paced rate through the raw path, the bare pipeline and the\n"+
			"SDK (latency); SDK workers → ingest → receipt and → projector KV (sdk); the projector's\n"+
			"catch-up and rebuild beside raw reads (projector). It uses DATABASE_URL when that answers\n"+
			"(point it at a scratch database), else a throwaway cluster. docs/benchmarks.md explains\n"+
			"every row.\n\n"+
			"With -external it measures the deployment's shape instead: a throwaway PostgreSQL (fsync on),\n"+
			"one nats-server, one ingest, one projector and -workers worker processes, each a process of its\n"+
			"own; the workers publish -events events at full speed through the Go SDK (or raw with -raw),\n"+
			"and it prints each component's CPU time per event, from /proc/<pid>/stat, and the events/s one\n"+
			"core of it carries. The ingest and projector binaries are found beside ledgerlab, or in -bin\n"+
			"('make bench-external' builds them). -compare N runs N pairs of external runs instead, SDK then\n"+
			"raw, each on a fresh deployment, and reports the SDK's rate over the raw publishers' and each\n"+
			"path's first second against the rest of its run. Each run first sends -warmup events of other\n"+
			"tasks through the ledger, so it measures workers joining a running ledger. -latency paces the workers at -rate events/s\n"+
			"(default half the raw publishers' full-speed rate, measured first) with no projector, and sets\n"+
			"their publish → receipt p50 and p99 beside a bare pipeline's publish → commit at the same rate,\n"+
			"itself a process of its own (a set-based fenced insert, nothing else).", stderr)
	only := f.String("only", "all", "sections to run, comma-separated: baselines, pipeline, latency, sdk, projector")
	events := f.Int("events", benchreport.EventsDefault, "events per throughput phase (and per pipeline round)")
	rounds := f.Int("rounds", benchreport.RoundsDefault, "alternating rounds of the full and the bare pipeline")
	rate := f.Int("rate", 0, "offered load of each latency path, events/s (0: half the full pipeline's saturation rate); with -external, needs -latency")
	duration := f.Duration("duration", benchreport.LatencyDurationDefault, "length of each latency path")
	workers := f.Int("workers", benchreport.WorkersDefault, "SDK workers (each holds 16/workers partitions)")
	cpuProfile := f.String("cpuprofile", "", "write a CPU profile of the whole run (every part runs in this process) to this file")
	memProfile := f.String("memprofile", "", "write an allocation profile at the end of the run to this file")
	external := f.Bool("external", false, "run every part as a process of its own and report each one's CPU time per event")
	raw := f.Bool("raw", false, "with -external: raw JetStream publishers instead of SDK workers")
	bin := f.String("bin", "", "with -external: directory of the ingest, projector and ledgerlab binaries (default: beside this ledgerlab)")
	ingestProfile := f.String("ingest-profile", "", "with -external: have the ingest write a CPU profile of its whole life to this file")
	projectorProfile := f.String("projector-profile", "", "with -external: have the projector write a CPU profile of its whole life to this file")
	natsProfile := f.String("nats-profile", "", "with -external: have the nats-server write a CPU profile of its whole life to this file")
	workerProfile := f.String("worker-profile", "", "with -external: have worker 0 write a CPU profile of its whole life to this file")
	tasks := f.Int("tasks", 0, "with -external: new tasks the events spread over (default one per 25 events, 16 to 2,000)")
	compare := f.Int("compare", 0, "with -external: run this many pairs of runs, SDK then raw, and compare them")
	warmup := f.Int("warmup", benchreport.WarmupDefault, "with -external: events of other tasks sent through the ledger before the run (0: none)")
	latency := f.Bool("latency", false, "with -external: publish at -rate and measure publish → receipt against a bare pipeline")
	sdkBatch := f.Int("sdk-batch", 0, "events per SDK batch message: 1 sends each alone, 0 the SDK's default (256)")
	logBatches := f.Bool("log-batches", false, "run the ingest with -log-batches (one LEDGER_LOG message per partition of a batch)")
	roles := f.Bool("roles", false, "with -external: run the ingest and the projector as users in ledger_ingest and ledger_projector, as production does (default: the schema's owner, for whom the database's fence checks nothing)")
	syncPolicy := f.Bool("sync-policy", false, "with -external: measure sync_interval always against the default, on R1 and R3")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	if err := externalFlags(f, *external); err != nil {
		return err
	}
	if *external {
		if *events < 1 || *workers < 1 || *workers > 16 || *compare < 0 || *tasks < 0 || *tasks > benchreport.MaxTasks {
			return Usagef("-events must be positive, -tasks 1..%d, -workers 1..16, -compare 0 or more", benchreport.MaxTasks)
		}
		if *compare > 0 && *raw {
			return Usagef("-compare runs both the SDK and the raw publishers: leave out -raw")
		}
		switch {
		case *rate < 0:
			return Usagef("-rate must be 0 (half the saturation rate) or more")
		case *warmup < 0:
			return Usagef("-warmup must be 0 (none) or more events")
		case *rate > 0 && !*latency && !*syncPolicy:
			return Usagef("-rate with -external paces a latency run: add -latency")
		case *latency && (*compare > 0 || *ingestProfile != ""):
			return Usagef("-latency runs on its own: leave out -compare and -ingest-profile")
		case *projectorProfile != "" && (*latency || *compare > 0 || *syncPolicy):
			return Usagef("-projector-profile profiles one run with a projector: leave out -latency, -compare and -sync-policy")
		case *natsProfile != "" && (*compare > 0 || *syncPolicy):
			return Usagef("-nats-profile profiles one run: leave out -compare and -sync-policy")
		case *workerProfile != "" && (*compare > 0 || *syncPolicy):
			return Usagef("-worker-profile profiles one run: leave out -compare and -sync-policy")
		}
		eo := benchreport.ExternalOptions{Events: *events, Tasks: *tasks, Workers: *workers, Raw: *raw, SDKBatchMax: *sdkBatch,
			Bin: *bin, IngestProfile: *ingestProfile, ProjectorProfile: *projectorProfile, NATSProfile: *natsProfile, WorkerProfile: *workerProfile, Progress: stderr, Latency: *latency, Rate: *rate, Warmup: *warmup, LogBatches: *logBatches, Roles: *roles}
		if *warmup == 0 {
			eo.Warmup = -1
		}
		if *syncPolicy {
			if *latency || *compare > 0 || *ingestProfile != "" {
				return Usagef("-sync-policy runs on its own: leave out -latency, -compare and -ingest-profile")
			}
			eo.Rate = *rate
			sp, err := benchreport.RunSyncPolicy(ctx, eo)
			if err != nil {
				return err
			}
			if f.JSON {
				return writeJSON(stdout, sp)
			}
			return sp.Print(stdout)
		}
		if *compare > 0 {
			c, err := benchreport.RunExternalCompare(ctx, eo, *compare)
			if err != nil {
				return err
			}
			if f.JSON {
				return writeJSON(stdout, c)
			}
			return c.Print(stdout)
		}
		r, err := benchreport.RunExternal(ctx, eo)
		if err != nil {
			return err
		}
		if f.JSON {
			return writeJSON(stdout, r)
		}
		return r.Print(stdout)
	}
	sections, err := benchreport.ParseSections(*only)
	if err != nil {
		return Usagef("-only: %v", err)
	}
	if *events < 1 || *rounds < 1 || *rate < 0 || *duration <= 0 || *workers < 1 || *workers > 16 {
		return Usagef("-events, -rounds and -duration must be positive, -rate 0 or more, -workers 1..16")
	}
	if *cpuProfile != "" {
		stop, err := admin.StartCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	if *memProfile != "" {
		runtime.MemProfileRate = 64 << 10
		defer writeHeapProfile(*memProfile, stderr)
	}
	// Every part of the ledger runs in this process: it runs with the
	// services' garbage-collector defaults, as the ingest and projector do.
	connect.TuneGC(nil)
	r, err := benchreport.Run(ctx, benchreport.Options{DatabaseURL: f.Conn.DatabaseURL, Only: sections, Events: *events,
		Rounds: *rounds, Rate: *rate, LatencyDuration: *duration, Workers: *workers, SDKBatchMax: *sdkBatch,
		LogBatches: *logBatches, Progress: stderr})
	if err != nil {
		return err
	}
	if f.JSON {
		return writeJSON(stdout, r)
	}
	return r.Print(stdout)
}

// externalFlags refuses the flags of the in-process report with -external,
// and the external run's without it.
func externalFlags(f *Flags, external bool) error {
	inProcess := map[string]bool{"only": true, "rounds": true, "duration": true, "cpuprofile": true,
		"memprofile": true, "database-url": true}
	externalOnly := map[string]bool{"raw": true, "bin": true, "ingest-profile": true, "projector-profile": true, "nats-profile": true, "worker-profile": true, "compare": true, "tasks": true, "sync-policy": true,
		"latency": true, "warmup": true, "roles": true}
	var err error
	f.Visit(func(fl *flag.Flag) {
		switch {
		case err != nil:
		case external && inProcess[fl.Name]:
			err = Usagef("-%s does not apply to -external (it starts its own PostgreSQL; profile the ingest with -ingest-profile)", fl.Name)
		case !external && externalOnly[fl.Name]:
			err = Usagef("-%s needs -external", fl.Name)
		}
	})
	return err
}

// benchWorker is one worker process of an external run ("bench worker"):
// it speaks to its coordinator on stdin and stdout.
func benchWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerlab bench worker", "-run ID -worker N -workers N -events N [-tasks N] [-raw] [-rate N] [-bare]",
		"One worker process of 'ledgerlab bench -external', which starts it: it takes its leases, says\n"+
			"\"ready\" on stdout, publishes its share of the events on \"go\" from stdin, and exits when stdin ends.\n"+
			"With -rate it publishes its share of that many events a second and reports their latencies;\n"+
			"-bare makes it the bare pipeline of a latency run (with -database-url).", stderr)
	var o benchreport.WorkerOptions
	f.StringVar(&o.Run, "run", "", "the run's id")
	f.IntVar(&o.Worker, "worker", 0, "this worker's number, 0..workers-1")
	f.IntVar(&o.Workers, "workers", 1, "how many workers the run has")
	f.IntVar(&o.Events, "events", 0, "the run's events, over every worker")
	f.IntVar(&o.Tasks, "tasks", 0, "the run's new tasks (default one per 25 events, 16 to 2,000)")
	f.BoolVar(&o.Raw, "raw", false, "raw JetStream publishes instead of the Go SDK")
	f.IntVar(&o.Rate, "rate", 0, "the run's events a second over every worker (0: full speed)")
	f.BoolVar(&o.Bare, "bare", false, "be the bare pipeline of a latency run")
	f.IntVar(&o.SDKBatchMax, "sdk-batch", 0, "events per SDK batch message: 1 sends each alone, 0 the SDK's default")
	cpuProfile := f.String("cpuprofile", "", "write a CPU profile of this worker's whole life to this file")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	o.NATSURL, o.DatabaseURL = f.Conn.NATSURL, f.Conn.DatabaseURL
	if *cpuProfile != "" {
		stop, err := admin.StartCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	return benchreport.RunWorker(ctx, o, os.Stdin, stdout)
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
		fmt.Fprintf(stderr, "ledgerlab bench: memory profile: %v\n", err)
	}
}
