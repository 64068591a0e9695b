// Package benchreport is `ledgerctl bench`: in one process and one run it
// measures the raw PostgreSQL baselines (a fenced INSERT per event, a
// set-based fenced insert, COPY, and the ledger's own fence.Append) and
// the full pipeline (SDK workers → ingest → receipts, and on through the
// projector to the bucket ledger_tasks), and reports events/s, their
// ratios to the set-based insert, and the latency percentiles from publish
// to JetStream ack, to receipt and to the bucket at a fixed offered load.
//
// Every phase runs the same shape of events: 16 partitions, tasks on
// their default partition, about 25 versions per task, ~200-byte JSON
// payloads. The phases run one after another against one in-process
// ledger (package localstack), so they share the host and the database.
package benchreport

import (
	"context"
	"fmt"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/localstack"
)

// Run starts a ledger in this process (see Options.DatabaseURL), runs
// every phase in turn while a progress line shows on Options.Progress, and
// returns the report. It fails, with the phase named, when an event is
// refused or does not get its receipt or bucket value in time.
func Run(ctx context.Context, o Options) (Report, error) {
	o = o.WithDefaults()
	if err := o.validate(); err != nil {
		return Report{}, err
	}
	prog := newProgress(o.Progress)
	defer prog.close()
	id := runID()
	prog.say("run %s: %s events a phase, %s events/s for %v, %d workers", id, group(int64(o.Events)),
		group(int64(o.Rate)), o.LatencyDuration, o.Workers)

	s, err := localstack.Start(ctx, localstack.Options{DatabaseURL: o.DatabaseURL, Logger: o.Logger, Say: prog.say})
	if err != nil {
		return Report{}, fmt.Errorf("benchreport: start the ledger: %w", err)
	}
	defer s.Close()
	// localstack falls back to a throwaway cluster when the URL does not
	// answer; its pool then has another connection string.
	throwaway := o.DatabaseURL == "" || s.Pool.Config().ConnString() != o.DatabaseURL
	r := Report{Machine: machine(ctx, s.Pool, throwaway), Events: o.Events, Tasks: taskCount(o.Events),
		Workers: o.Workers, Rate: o.Rate, LatencyDuration: o.LatencyDuration}

	b := &baselines{pool: s.Pool, o: o, id: id, prog: prog}
	if err := b.run(ctx, &r); err != nil {
		return Report{}, err
	}
	p, err := startPipeline(ctx, s, o, id, prog)
	if err != nil {
		return Report{}, err
	}
	defer p.close()
	if err := p.throughput(ctx, &r); err != nil {
		return Report{}, err
	}
	if err := p.latency(ctx, &r); err != nil {
		return Report{}, err
	}
	r.ratios()
	return r, nil
}
