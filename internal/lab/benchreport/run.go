// Package benchreport is `ledgerlab bench`, the project's one pipeline
// benchmark harness: in one process and one run, on one machine, it
// measures
//
//   - the raw PostgreSQL baselines (a fenced INSERT per event, a set-based
//     fenced insert, COPY) and the ledger's own fence.Append;
//   - raw JetStream publishers into the full ingest and into a bare
//     pipeline (one set-based fenced insert per batch, nothing else), in
//     alternating rounds, with the machine's CPU time per event;
//   - publish → receipt latency at a paced rate through the raw path, the
//     bare pipeline and the Go SDK;
//   - SDK workers → ingest → receipt and → projector → bucket ledger_tasks,
//     and the run's first second against the rest;
//   - the projector catching up on LEDGER_LOG and rebuilding from
//     PostgreSQL, beside raw reads of the same data;
//
// and reports events/s, ratios (to the set-based insert, full to bare, p99
// to the bare pipeline's, first second to the rest, projector to raw read)
// and latency percentiles. docs/benchmarks.md says how to read them.
//
// Every phase runs the same shape of events: 16 partitions, tasks on
// their default partition, about 25 versions per task, ~200-byte JSON
// payloads. The phases run one after another against one in-process
// ledger (package localstack), so they share the host and the database.
//
// RunExternal ("ledgerlab bench -external") measures the deployment's
// shape instead: PostgreSQL, the nats-server, the ingest, the projector and
// the workers each a process of its own (package chaos starts the
// services; RunWorker is a worker), the same shape of events, and each
// component's CPU time per event from /proc/<pid>/stat.
package benchreport

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/localstack"
)

// Run starts a ledger in this process (see Options.DatabaseURL), runs the
// chosen sections in turn while a progress line shows on Options.Progress,
// and returns the report. It fails, with the phase named, when an event is
// refused or does not get its receipt, commit or bucket value in time.
func Run(ctx context.Context, o Options) (Report, error) {
	o = o.WithDefaults()
	if err := o.validate(); err != nil {
		return Report{}, err
	}
	prog := newProgress(o.Progress)
	defer prog.close()
	id := runID()
	var names []string
	for _, s := range o.sections() {
		names = append(names, string(s))
	}
	prog.say("run %s: %s; %s events a phase, %d rounds, %d workers", id, strings.Join(names, ", "),
		group(int64(o.Events)), o.Rounds, o.Workers)

	s, err := localstack.Start(ctx, localstack.Options{DatabaseURL: o.DatabaseURL, Logger: o.Logger, Say: prog.say,
		Ingest: ingest.Config{LogBatches: o.LogBatches}})
	if err != nil {
		return Report{}, fmt.Errorf("benchreport: start the ledger: %w", err)
	}
	defer s.Close()
	// localstack falls back to a throwaway cluster when the URL does not
	// answer; its pool then has another connection string.
	throwaway := o.DatabaseURL == "" || s.Pool.Config().ConnString() != o.DatabaseURL
	r := Report{Machine: machine(ctx, s.Pool, throwaway), Sections: o.sections(), Events: o.Events, Rounds: o.Rounds,
		Tasks: taskCount(o.Events), Workers: o.Workers, LatencyDuration: o.LatencyDuration, GCPercent: gcPercent(), LogBatches: o.LogBatches}
	if err := runSections(ctx, s, o, id, prog, &r); err != nil {
		return Report{}, err
	}
	r.ratios()
	return r, nil
}

// runSections measures the chosen sections. The raw ones run with the
// projector stopped, so that the full pipeline is the ingest alone; the SDK
// ones with it, as a deployment runs.
func runSections(ctx context.Context, s *localstack.Stack, o Options, id string, prog *progress, r *Report) error {
	if o.runs(SectionBaselines) || o.runs(SectionPipeline) || o.runs(SectionLatency) {
		drop, err := createScratch(ctx, s.Pool)
		if err != nil {
			return err
		}
		defer drop()
	}
	if o.runs(SectionBaselines) {
		b := &baselines{pool: s.Pool, o: o, id: id, prog: prog}
		if err := b.run(ctx, r); err != nil {
			return err
		}
	}
	var raw *rawBench
	if o.runs(SectionPipeline) || o.runs(SectionLatency) || o.runs(SectionProjector) {
		var err error
		if raw, err = startRaw(ctx, s, o, id, prog); err != nil {
			return err
		}
		defer raw.close()
	}
	if o.runs(SectionPipeline) || o.runs(SectionLatency) {
		pb, err := newProjectorBench(s, raw, o, prog)
		if err != nil {
			return err
		}
		err = s.RestartProjector(ctx, func() error {
			prog.say("projector stopped for the raw pipelines")
			if err := rawSections(ctx, raw, o, r); err != nil {
				return err
			}
			c, err := pb.consumer(ctx)
			if err != nil {
				return err
			}
			r.ProjectorBacklog = int(c.NumPending) + c.NumAckPending
			return nil
		})
		if err != nil {
			return err
		}
		// The SDK phases and the catch-up start from a projector that
		// has caught up.
		prog.say("projector started again; catching up on %s log messages", group(int64(r.ProjectorBacklog)))
		if err := pb.drained(ctx, nil); err != nil {
			return fmt.Errorf("benchreport: projector catching up after the raw pipelines: %w", err)
		}
	}
	if o.runs(SectionSDK) || o.runs(SectionLatency) {
		if err := sdkSections(ctx, s, o, id, prog, r); err != nil {
			return err
		}
	}
	if o.runs(SectionProjector) {
		b, err := newProjectorBench(s, raw, o, prog)
		if err != nil {
			return err
		}
		if err := b.run(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// sdkSections runs the SDK section and the SDK path of the latency section,
// whose rate rawSections set.
func sdkSections(ctx context.Context, s *localstack.Stack, o Options, id string, prog *progress, r *Report) error {
	p, err := startPipeline(ctx, s, o, id, prog)
	if err != nil {
		return err
	}
	defer p.close()
	if o.runs(SectionSDK) {
		if err := p.throughput(ctx, r); err != nil {
			return err
		}
	}
	if o.runs(SectionLatency) {
		return p.latency(ctx, r, r.Rate)
	}
	return nil
}

// rawSections runs the pipeline section and the raw and bare paths of the
// latency section, and sets the latency rate.
func rawSections(ctx context.Context, raw *rawBench, o Options, r *Report) error {
	if err := raw.hold(ctx); err != nil {
		return err
	}
	defer raw.letGo()
	if o.runs(SectionPipeline) {
		if err := raw.pipeline(ctx, r); err != nil {
			return err
		}
	}
	if !o.runs(SectionLatency) {
		return nil
	}
	r.Rate, r.RateGiven = o.Rate, o.Rate > 0
	if !r.RateGiven {
		if r.Saturation == 0 {
			if err := raw.saturation(ctx, r); err != nil {
				return err
			}
		}
		r.Rate = halfRate(r.Saturation, o.LatencyDuration)
	}
	return raw.latency(ctx, r, r.Rate)
}

// halfRate is the default latency rate: half the full pipeline's
// saturation rate, and at least enough for one event in d.
func halfRate(saturation float64, d time.Duration) int {
	rate := int(saturation / 2)
	for latencyEvents(rate, d) < 1 {
		rate++
	}
	return rate
}
