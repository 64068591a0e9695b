package benchreport

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// measureFn runs one round of a pipeline and returns its rate, events/s,
// and the machine's CPU time per event.
type measureFn func(ctx context.Context, round int) (float64, time.Duration, error)

// alternate runs rounds rounds of full then bare. A shared 2-core machine
// drifts by ±15% within a minute; measuring one pipeline after the other
// would put that drift into their ratio, alternating puts it into both.
func alternate(ctx context.Context, rounds int, full, bare measureFn, each func(int, Round)) ([]Round, error) {
	out := make([]Round, 0, rounds)
	for i := range rounds {
		var rd Round
		var err error
		if rd.Full, rd.FullCPU, err = full(ctx, i); err != nil {
			return nil, fmt.Errorf("round %d, full pipeline: %w", i+1, err)
		}
		if rd.Bare, rd.BareCPU, err = bare(ctx, i); err != nil {
			return nil, fmt.Errorf("round %d, bare pipeline: %w", i+1, err)
		}
		out = append(out, rd)
		if each != nil {
			each(i, rd)
		}
	}
	return out, nil
}

// roundSummary is what the report keeps of the rounds: medians.
type roundSummary struct {
	full, bare       float64
	ratio            float64 // the median of the per-round ratios, not the ratio of the medians
	fullCPU, bareCPU time.Duration
}

func summarize(rounds []Round) roundSummary {
	var s roundSummary
	var full, bare, ratios []float64
	var fullCPU, bareCPU []time.Duration
	for _, r := range rounds {
		full, bare, ratios = append(full, r.Full), append(bare, r.Bare), append(ratios, r.Ratio())
		fullCPU, bareCPU = append(fullCPU, r.FullCPU), append(bareCPU, r.BareCPU)
	}
	s.full, s.bare, s.ratio = median(full), median(bare), median(ratios)
	s.fullCPU, s.bareCPU = median(fullCPU), median(bareCPU)
	return s
}

// median is the middle value, or the mean of the two middle ones.
func median[T float64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// pipeline runs the pipeline section: Rounds alternating rounds of Events
// events through the full and the bare pipeline.
func (r *rawBench) pipeline(ctx context.Context, rep *Report) error {
	n := r.o.Events
	full := func(ctx context.Context, i int) (float64, time.Duration, error) {
		if err := r.leases.renew(ctx); err != nil {
			return 0, 0, err
		}
		return r.fullRound(ctx, fmt.Sprintf("pipeline round %d/%d: raw → ingest", i+1, r.o.Rounds), n)
	}
	bare := func(ctx context.Context, i int) (float64, time.Duration, error) {
		return r.bareRound(ctx, fmt.Sprintf("pipeline round %d/%d: raw → bare", i+1, r.o.Rounds), n)
	}
	say := func(i int, rd Round) {
		r.prog.say("pipeline round %d/%d: full %s events/s, bare %s events/s, full/bare %.2f; CPU per event full %s, bare %s",
			i+1, r.o.Rounds, group(int64(rd.Full)), group(int64(rd.Bare)), rd.Ratio(), formatCPU(rd.FullCPU), formatCPU(rd.BareCPU))
	}
	rounds, err := alternate(ctx, r.o.Rounds, full, bare, say)
	if err != nil {
		return fmt.Errorf("benchreport: pipeline: %w", err)
	}
	if err := r.checkCommitted(ctx); err != nil {
		return fmt.Errorf("benchreport: pipeline: %w", err)
	}
	s := summarize(rounds)
	total := n * len(rounds)
	rep.PipelineRounds = rounds
	rep.FullPipeline = Row{Label: LabelFullPipeline, Events: total, Elapsed: elapsedAt(total, s.full), PerSecond: s.full,
		Rounds: len(rounds), Relative: s.ratio, RelativeTo: "bare, median by round", CPUPerEvent: s.fullCPU}
	rep.BarePipeline = Row{Label: LabelBarePipeline, Events: total, Elapsed: elapsedAt(total, s.bare), PerSecond: s.bare,
		Rounds: len(rounds), CPUPerEvent: s.bareCPU}
	if s.fullCPU > 0 && s.bareCPU > 0 {
		rep.CPURatio = float64(s.bareCPU) / float64(s.fullCPU)
	}
	rep.Saturation = s.full
	return r.hotPipeline(ctx, rep)
}

// hotPipeline runs Rounds alternating rounds of the hot load and the
// many-tasks load through the full pipeline: a hot task is a normal task
// when their ratio stays near 1.
func (r *rawBench) hotPipeline(ctx context.Context, rep *Report) error {
	n := r.o.Events
	round := func(src *rawSource, name string) measureFn {
		return func(ctx context.Context, i int) (float64, time.Duration, error) {
			if err := r.leases.renew(ctx); err != nil {
				return 0, 0, err
			}
			return r.fullRoundOf(ctx, src, fmt.Sprintf("hot tasks round %d/%d: %s", i+1, r.o.Rounds, name), n)
		}
	}
	say := func(i int, rd Round) {
		r.prog.say("hot tasks round %d/%d: hot %s events/s, many tasks %s events/s, hot/many %.2f",
			i+1, r.o.Rounds, group(int64(rd.Full)), group(int64(rd.Bare)), rd.Ratio())
	}
	rounds, err := alternate(ctx, r.o.Rounds, round(r.hot, "16 tasks"), round(r.full, "many tasks"), say)
	if err != nil {
		return fmt.Errorf("benchreport: hot tasks: %w", err)
	}
	if err := r.checkCommitted(ctx); err != nil {
		return fmt.Errorf("benchreport: hot tasks: %w", err)
	}
	s := summarize(rounds)
	total := n * len(rounds)
	rep.HotPipeline = Row{Label: LabelHotPipeline, Events: total, Elapsed: elapsedAt(total, s.full), PerSecond: s.full,
		Rounds: len(rounds), Relative: s.ratio, RelativeTo: "many tasks, median by round", CPUPerEvent: s.fullCPU}
	return nil
}

// saturation measures the full pipeline's rate in one round, for the
// latency section's default rate when the pipeline section does not run.
func (r *rawBench) saturation(ctx context.Context, rep *Report) error {
	if err := r.leases.renew(ctx); err != nil {
		return err
	}
	rate, _, err := r.fullRound(ctx, "latency: the full pipeline's saturation rate", r.o.Events)
	if err != nil {
		return fmt.Errorf("benchreport: saturation: %w", err)
	}
	rep.Saturation = rate
	return r.checkCommitted(ctx)
}

// latency runs the raw and bare paths of the latency section at rate, in
// two alternating halves.
func (r *rawBench) latency(ctx context.Context, rep *Report, rate int) error {
	n := latencyEvents(rate, r.o.LatencyDuration)
	title := fmt.Sprintf("latency @ %s/s", group(int64(rate)))
	var raw, bare []time.Duration
	var rawTook, bareTook time.Duration
	for _, h := range halves(n) {
		if err := r.leases.renew(ctx); err != nil {
			return fmt.Errorf("benchreport: %s: %w", title, err)
		}
		t, took, err := r.rawLatency(ctx, title+": raw → receipt", h, rate)
		if err != nil {
			return fmt.Errorf("benchreport: %s, raw path: %w", title, err)
		}
		raw, rawTook = append(raw, t.latencies()...), rawTook+took
		if t, took, err = r.bareLatency(ctx, title+": raw → bare commit", h, rate); err != nil {
			return fmt.Errorf("benchreport: %s, bare pipeline: %w", title, err)
		}
		bare, bareTook = append(bare, t.latencies()...), bareTook+took
	}
	if err := r.checkCommitted(ctx); err != nil {
		return fmt.Errorf("benchreport: %s: %w", title, err)
	}
	rep.LatencyRaw = latencyRow(title+": raw publish → receipt", raw, n, rawTook)
	rep.LatencyBare = latencyRow(title+": bare publish → commit", bare, n, bareTook)
	return nil
}

// elapsedAt is how long n events take at rate.
func elapsedAt(n int, rate float64) time.Duration {
	if rate <= 0 {
		return 0
	}
	return time.Duration(float64(n) / rate * float64(time.Second))
}

func formatCPU(d time.Duration) string {
	if d <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}
