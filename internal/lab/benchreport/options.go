package benchreport

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// Defaults of Options.
const (
	// EventsDefault is how many events each throughput phase inserts or
	// publishes (each round of the pipeline section, each pipeline):
	// 50,000.
	EventsDefault = 50_000
	// RoundsDefault is how many rounds the pipeline section runs of each
	// pipeline, full and bare alternating: 5.
	RoundsDefault = 5
	// LatencyDurationDefault is how long each path of the latency section
	// publishes: 5 s.
	LatencyDurationDefault = 5 * time.Second
	// WorkersDefault is how many SDK clients publish in the SDK phases:
	// 4, each holding 4 of the 16 partitions.
	WorkersDefault = 4
	// PerEventMax caps the events of the per-event INSERT baseline: 5,000.
	// One commit per event is slow (a few thousand a second), and more
	// events would not change its rate.
	PerEventMax = 5_000
	// WarmupDefault is how many events an external run sends through the
	// ledger before it measures: 20,000, about a second at full speed on 2
	// CPUs. A deployment's services that have just started spend their
	// first second growing heaps, caches and connections, which a worker
	// joining a running ledger does not meet.
	WarmupDefault = 20_000
	// MaxTasks bounds the new tasks of an external run (-tasks): 1,000,000.
	MaxTasks = 1_000_000
	// BatchSize is the batch of the set-based baselines (set-based insert,
	// COPY, fence.Append): 1,000.
	BatchSize = 1_000
	// MaxInFlight is the SDK's in-flight bound per lease in the SDK
	// phases: the SDK's default (1,024), what a worker gets unless it says
	// otherwise. At 2,048 the steady rate was a few percent higher, but the
	// first second fell to about half of the rest: 16 leases queue 32,768
	// events behind their head lookups and then send them at once.
	MaxInFlight = worker.MaxInFlightDefault
	// RawInFlight is the raw publishers' window: at most 2,000 publishes
	// await their JetStream ack, and the publisher waits while it is full.
	RawInFlight = 2_000
	// BareConsumers and BareFetch shape the bare pipeline: 4 goroutines,
	// each fetching up to 500 messages, inserting them with one set-based
	// fenced insert and acking them.
	BareConsumers = 4
	BareFetch     = 500
	// FirstWindow is the start of the SDK run whose rate is compared with
	// the rest: 1 s (half the run when the run is shorter than 2 s).
	FirstWindow = time.Second
	// ReceiptTimeout is how long, after a latency phase stopped publishing,
	// every event has to get its receipt (or commit) and reach the bucket:
	// 30 s. A throughput phase fails when it made no progress for that
	// long.
	ReceiptTimeout = 30 * time.Second
	// progressEvery is how often the progress line is rewritten.
	progressEvery = 300 * time.Millisecond
)

// partitions is the partition count every phase spreads its events over.
const partitions = wire.PartitionsDefault

// Section is a part of the report that can run on its own.
type Section string

// The sections, in the order a run measures them.
const (
	// SectionBaselines: per-event INSERT, set-based fenced insert, COPY,
	// fence.Append.
	SectionBaselines Section = "baselines"
	// SectionPipeline: raw publishers → full pipeline and → bare pipeline,
	// alternating rounds, with the machine's CPU time per event.
	SectionPipeline Section = "pipeline"
	// SectionLatency: publish → receipt at a paced rate through the raw
	// path, the bare pipeline and the SDK.
	SectionLatency Section = "latency"
	// SectionSDK: SDK workers → ingest → receipt and → projector KV over
	// fresh tasks, and the run's first second against the rest.
	SectionSDK Section = "sdk"
	// SectionProjector: the projector catching up on LEDGER_LOG and a
	// rebuild from PostgreSQL, each beside a raw read of the same data.
	SectionProjector Section = "projector"
)

// Sections lists every section, in run order.
var Sections = []Section{SectionBaselines, SectionPipeline, SectionLatency, SectionSDK, SectionProjector}

// ParseSections reads a comma-separated list of section names, such as
// "pipeline,latency"; empty or "all" means every section.
func ParseSections(spec string) ([]Section, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "all" {
		return slices.Clone(Sections), nil
	}
	var out []Section
	for name := range strings.SplitSeq(spec, ",") {
		s := Section(strings.TrimSpace(name))
		if !slices.Contains(Sections, s) {
			return nil, fmt.Errorf("benchreport: no section %q (sections: %s)", s, sectionNames())
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	// They run in one order whatever the list's; the report lists them so.
	slices.SortFunc(out, func(a, b Section) int { return slices.Index(Sections, a) - slices.Index(Sections, b) })
	return out, nil
}

func sectionNames() string {
	names := make([]string, len(Sections))
	for i, s := range Sections {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// Options configure a benchmark run. The zero value runs every section
// with the defaults against a throwaway PostgreSQL cluster.
type Options struct {
	// DatabaseURL is the PostgreSQL to run against; when empty or
	// unreachable a throwaway cluster is started from the local
	// installation (and removed afterwards). Point it only at a scratch
	// database, never at a live ledger: the run migrates it, takes every
	// partition's lease, appends events to ledger.events under tasks named
	// bench-<run>-…, rebuilds the bucket ledger_tasks from it, and creates
	// and drops the schema ledger_bench.
	DatabaseURL string
	// Only lists the sections to run; default (nil) every section.
	Only []Section
	// Events is how many events each throughput phase inserts or publishes
	// (the per-event INSERT baseline takes at most PerEventMax of them);
	// default 50,000.
	Events int
	// Rounds is how many rounds the pipeline section runs of each
	// pipeline, alternating; default 5.
	Rounds int
	// Rate is the load offered on each path of the latency section, in
	// events/s; default 0: half the full pipeline's saturation rate as the
	// pipeline section measured it (or as one full-pipeline round measures
	// it first, when that section does not run).
	Rate int
	// LatencyDuration is how long each path of the latency section
	// publishes; default 5 s. A path publishes Rate×LatencyDuration events.
	LatencyDuration time.Duration
	// Workers is how many SDK clients publish in the SDK phases, each on
	// its own NATS connection and holding an equal share of the 16
	// partitions (partition p belongs to worker p mod Workers); 1..16,
	// default 4.
	Workers int
	// SDKBatchMax is the SDK clients' worker.Config.BatchMax: 1 sends
	// every event alone; default 0, the SDK's default (batches on).
	SDKBatchMax int
	// LogBatches runs the ingest with log batches (ingest.Config
	// LogBatches): one LEDGER_LOG message per partition of a batch.
	LogBatches bool
	// Progress receives one progress line, rewritten in place with "\r"
	// about every 300 ms, and the setup steps and rounds; default
	// os.Stderr. Use io.Discard to silence it. The line is cleared before
	// Run returns.
	Progress io.Writer
	// Logger receives the logs of the in-process ingest, projector and SDK
	// clients; default discards them.
	Logger *slog.Logger
}

// WithDefaults returns o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.Only == nil {
		o.Only = slices.Clone(Sections)
	}
	o.Events = cmp.Or(o.Events, EventsDefault)
	o.Rounds = cmp.Or(o.Rounds, RoundsDefault)
	o.LatencyDuration = cmp.Or(o.LatencyDuration, LatencyDurationDefault)
	o.Workers = cmp.Or(o.Workers, WorkersDefault)
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

func (o Options) validate() error {
	switch {
	case len(o.Only) == 0:
		return fmt.Errorf("benchreport: no section to run")
	case o.Events < 1:
		return fmt.Errorf("benchreport: events must be at least 1, got %d", o.Events)
	case o.Rounds < 1:
		return fmt.Errorf("benchreport: rounds must be at least 1, got %d", o.Rounds)
	case o.Rate < 0:
		return fmt.Errorf("benchreport: rate must not be negative, got %d", o.Rate)
	case o.LatencyDuration <= 0:
		return fmt.Errorf("benchreport: latency duration must be positive, got %v", o.LatencyDuration)
	case o.Rate > 0 && latencyEvents(o.Rate, o.LatencyDuration) < 1:
		return fmt.Errorf("benchreport: %d events/s for %v is not a single event", o.Rate, o.LatencyDuration)
	case o.Workers < 1 || o.Workers > partitions:
		return fmt.Errorf("benchreport: workers must be 1..%d (one partition each at least), got %d", partitions, o.Workers)
	}
	for _, s := range o.Only {
		if !slices.Contains(Sections, s) {
			return fmt.Errorf("benchreport: no section %q (sections: %s)", s, sectionNames())
		}
	}
	return nil
}

// sections lists the sections the run includes, in run order.
func (o Options) sections() []Section {
	return slices.DeleteFunc(slices.Clone(Sections), func(s Section) bool { return !o.runs(s) })
}

// runs reports whether the run includes section s.
func (o Options) runs(s Section) bool { return slices.Contains(o.Only, s) }

// latencyEvents is how many events a latency path publishes at rate for
// d: rate×d, never more.
func latencyEvents(rate int, d time.Duration) int {
	return int(float64(rate) * d.Seconds())
}

// perEventEvents is how many events the per-event INSERT baseline inserts.
func (o Options) perEventEvents() int { return min(o.Events, PerEventMax) }

// taskCount is how many tasks a phase spreads its events over: about 25
// versions per task, between 16 and 2,000 tasks.
func taskCount(events int) int { return min(max(events/25, partitions), 2000) }
