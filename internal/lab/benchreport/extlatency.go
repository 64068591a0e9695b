package benchreport

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// latencyRun is an external latency run ("ledgerlab bench -external
// -latency"): on a deployment without a projector (the receipt does not
// wait for it), Workers worker processes publish at Rate events a second,
// raw or through the SDK, each timing its events from publish to receipt;
// then one process runs the bare pipeline at the same rate, publishing
// into a stream of its own and committing with the set-based fenced
// insert, timing publish → commit. The two alternate in two halves of
// Events each, as the in-process report's latency section does, so that a
// drift of the machine weighs on both. Without a rate it first measures the
// raw publishers' full-speed rate (a throughput run, whose rows the report
// keeps) and offers half. Either way the ledger is warmed up first.
func (e *external) latencyRun(ctx context.Context) (ExternalReport, error) {
	r := ExternalReport{Machine: machine(ctx, e.d.Pool(), true), Events: e.o.Events, Tasks: e.o.Tasks,
		Workers: e.o.Workers, Raw: e.o.Raw, Roles: e.o.Roles}
	lat := &ExternalLatency{Rate: e.o.Rate}
	if lat.Rate == 0 {
		sat := *e
		sat.o.Raw = true
		sr, err := sat.run(ctx)
		if err != nil {
			return r, fmt.Errorf("benchreport: the saturation run: %w", err)
		}
		r.Receipt, r.Components, r.Total, r.LoadBefore, r.LoadAfter = sr.Receipt, sr.Components, sr.Total, sr.LoadBefore, sr.LoadAfter
		r.Stages = sr.Stages
		lat.Saturation = sr.Receipt.PerSecond
		lat.Rate = max(int(lat.Saturation/2), 1)
		e.prog.say("saturation: %s events/s (raw); latency at %s events/s", group(int64(lat.Saturation+0.5)), group(int64(lat.Rate)))
		r.Warmup = sr.Warmup
	} else {
		n, err := e.warmUp(ctx) // the saturation run warms up otherwise
		if err != nil {
			return r, err
		}
		r.Warmup = n
	}
	drop, err := createScratch(ctx, e.d.Pool())
	if err != nil {
		return r, err
	}
	defer drop()
	js, err := jetstream.New(e.d.NATS())
	if err != nil {
		return r, err
	}
	if _, err := createBareStream(ctx, js); err != nil {
		return r, err
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), bareStream) }()

	kind := "SDK"
	if e.o.Raw {
		kind = "raw"
	}
	path, bare := latencies{}, latencies{}
	var pathTook, bareTook time.Duration
	stages := map[string]stageHist{} // the ingest's, over the path's phases
	stagesOK := true
	for _, n := range halves(e.o.Events) {
		before, err := scrapeStages(ctx, e.d.IngestAdmin())
		stagesOK = stagesOK && err == nil
		took, err := e.paced(ctx, workerSpec{id: runID(), workers: e.o.Workers, events: n, rate: lat.Rate,
			tasks: e.o.Tasks, raw: e.o.Raw}, path)
		if err != nil {
			return r, fmt.Errorf("benchreport: %s publishers at %d events/s: %w", kind, lat.Rate, err)
		}
		pathTook += took
		after, err := scrapeStages(ctx, e.d.IngestAdmin())
		stagesOK = stagesOK && err == nil
		if err != nil {
			e.prog.say("no stage breakdown: %v", err)
		}
		for name, h := range after {
			stages[name] = stages[name].plus(h.since(before[name]))
		}
		took, err = e.paced(ctx, workerSpec{id: runID(), workers: 1, events: n, rate: lat.Rate,
			tasks: e.o.Tasks, bare: true}, bare)
		if err != nil {
			return r, fmt.Errorf("benchreport: the bare pipeline at %d events/s: %w", lat.Rate, err)
		}
		bareTook += took
	}
	title := fmt.Sprintf("latency @ %s/s", group(int64(lat.Rate)))
	lat.Path = histogramRow(title+": "+kind+" publish → receipt", path, pathTook)
	lat.Bare = histogramRow(title+": bare publish → commit", bare, bareTook)
	if lat.Bare.P99 > 0 {
		lat.Path.Relative, lat.Path.RelativeTo = float64(lat.Path.P99)/float64(lat.Bare.P99), "bare p99"
	}
	if stagesOK {
		lat.Stages = stageRows(stages)
	}
	r.Latency = lat
	return r, nil
}

// paced runs one paced phase: the spec's worker processes publish its
// events at its rate; their latencies are added to into. It returns how
// long the phase took, from the first publish to the last receipt.
func (e *external) paced(ctx context.Context, sp workerSpec, into latencies) (time.Duration, error) {
	what := "publishers"
	if sp.bare {
		what = "bare pipeline"
	}
	e.prog.say("latency: %s, %s events at %s/s", what, group(int64(sp.events)), group(int64(sp.rate)))
	lines, err := e.runWorkers(ctx, sp)
	if err != nil {
		return 0, err
	}
	var first, last int64
	for i, l := range lines {
		if l.Latency == nil && l.Events > 0 {
			return 0, fmt.Errorf("worker %d measured no latency", i)
		}
		into.merge(l.Latency)
		if l.Events > 0 {
			first = minNonZero(first, l.FirstPublish)
			last = max(last, l.LastReceipt)
		}
	}
	return time.Duration(last - first), nil
}

// histogramRow summarises a merged histogram of events measured over took.
func histogramRow(label string, l latencies, took time.Duration) Row {
	row := throughputRow(label, int(l.count()), took)
	row.Latency = true
	row.P50, row.P99 = l.percentile(50), l.percentile(99)
	return row
}
