package benchreport

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/flowness/ledger/pkg/wire"
)

// Defaults of Options.
const (
	// EventsDefault is how many events each throughput phase inserts or
	// publishes: 50,000.
	EventsDefault = 50_000
	// RateDefault is the load offered during the latency phase: 10,000
	// events/s.
	RateDefault = 10_000
	// LatencyDurationDefault is how long the latency phase publishes: 5 s.
	LatencyDurationDefault = 5 * time.Second
	// WorkersDefault is how many SDK clients publish in the pipeline phases:
	// 4, each holding 4 of the 16 partitions.
	WorkersDefault = 4
	// PerEventMax caps the events of the per-event INSERT baseline: 5,000.
	// One commit per event is slow (a few thousand a second), and more
	// events would not change its rate.
	PerEventMax = 5_000
	// BatchSize is the batch of the set-based baselines (set-based insert,
	// COPY, fence.Append): 1,000.
	BatchSize = 1_000
	// MaxInFlight is the SDK's in-flight bound per lease in the pipeline
	// phases: 2,048.
	MaxInFlight = 2_048
	// ReceiptTimeout is how long, after the latency phase stopped
	// publishing, every event has to get its receipt and reach the bucket:
	// 30 s. The throughput phase fails when no receipt and no bucket update
	// arrived for that long.
	ReceiptTimeout = 30 * time.Second
	// progressEvery is how often the progress line is rewritten.
	progressEvery = 300 * time.Millisecond
)

// partitions is the partition count every phase spreads its events over.
const partitions = wire.PartitionsDefault

// Options configure a benchmark run. The zero value runs the defaults
// against a throwaway PostgreSQL cluster.
type Options struct {
	// DatabaseURL is the PostgreSQL to run against; when empty or
	// unreachable a throwaway cluster is started from the local
	// installation (and removed afterwards). Point it only at a scratch
	// database, never at a live ledger: the run migrates it, takes every
	// partition's lease, appends about 2×Events+Rate×LatencyDuration
	// events to ledger.events under tasks named bench-<run>-…, and creates
	// and drops the schema ledger_bench.
	DatabaseURL string
	// Events is how many events each throughput phase inserts or publishes
	// (the per-event INSERT baseline takes at most PerEventMax of them);
	// default 50,000.
	Events int
	// Rate is the load offered during the latency phase, in events/s;
	// default 10,000.
	Rate int
	// LatencyDuration is how long the latency phase publishes at Rate;
	// default 5 s. The phase publishes exactly Rate×LatencyDuration events.
	LatencyDuration time.Duration
	// Workers is how many SDK clients publish in the pipeline phases, each
	// on its own NATS connection and holding an equal share of the 16
	// partitions (partition p belongs to worker p mod Workers); 1..16,
	// default 4.
	Workers int
	// Progress receives one progress line, rewritten in place with "\r"
	// about every 300 ms, and the setup steps; default os.Stderr. Use
	// io.Discard to silence it. The line is cleared before Run returns.
	Progress io.Writer
	// Logger receives the logs of the in-process ingest, projector and SDK
	// clients; default discards them.
	Logger *slog.Logger
}

// WithDefaults returns o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.Events == 0 {
		o.Events = EventsDefault
	}
	if o.Rate == 0 {
		o.Rate = RateDefault
	}
	if o.LatencyDuration == 0 {
		o.LatencyDuration = LatencyDurationDefault
	}
	if o.Workers == 0 {
		o.Workers = WorkersDefault
	}
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
	case o.Events < 1:
		return fmt.Errorf("benchreport: events must be at least 1, got %d", o.Events)
	case o.Rate < 1:
		return fmt.Errorf("benchreport: rate must be at least 1 event/s, got %d", o.Rate)
	case o.LatencyDuration <= 0:
		return fmt.Errorf("benchreport: latency duration must be positive, got %v", o.LatencyDuration)
	case o.latencyEvents() < 1:
		return fmt.Errorf("benchreport: %d events/s for %v is not a single event", o.Rate, o.LatencyDuration)
	case o.Workers < 1 || o.Workers > partitions:
		return fmt.Errorf("benchreport: workers must be 1..%d (one partition each at least), got %d", partitions, o.Workers)
	}
	return nil
}

// latencyEvents is how many events the latency phase publishes:
// Rate×LatencyDuration, never more.
func (o Options) latencyEvents() int {
	return int(float64(o.Rate) * o.LatencyDuration.Seconds())
}

// perEventEvents is how many events the per-event INSERT baseline inserts.
func (o Options) perEventEvents() int { return min(o.Events, PerEventMax) }

// taskCount is how many tasks a phase spreads its events over: about 25
// versions per task, between 16 and 2,000 tasks.
func taskCount(events int) int { return min(max(events/25, partitions), 2000) }
