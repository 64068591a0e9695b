package benchreport

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// Comparison is the SDK path against raw publishers in the deployment's
// shape, measured in one invocation: external runs alternate, SDK then
// raw, each on a fresh deployment, so that both see the same machine at
// about the same time. Both read every receipt and both run with the
// projector; they differ only in how the workers publish.
type Comparison struct {
	// Rounds are the runs, in pairs: SDK, then raw.
	Rounds []ComparisonRound `json:"rounds"`
	// Ratio is the median over the rounds of the SDK's receipt rate over
	// the raw publishers'; SDKFirst and RawFirst the medians of each path's
	// first-second rate over the rest of its run (0 where the runs were too
	// short to split).
	Ratio    float64 `json:"sdk_over_raw"`
	SDKFirst float64 `json:"sdk_first_second"`
	RawFirst float64 `json:"raw_first_second"`
}

// ComparisonRound is one pair of runs.
type ComparisonRound struct {
	SDK ExternalReport `json:"sdk"`
	Raw ExternalReport `json:"raw"`
}

// RunExternalCompare runs rounds pairs of external runs with o (its Raw
// ignored): the SDK's, then the raw publishers'.
func RunExternalCompare(ctx context.Context, o ExternalOptions, rounds int) (Comparison, error) {
	if rounds < 1 {
		return Comparison{}, fmt.Errorf("benchreport: rounds must be at least 1, got %d", rounds)
	}
	var c Comparison
	for range rounds {
		var rd ComparisonRound
		for _, raw := range []bool{false, true} {
			ro := o
			ro.Raw = raw
			r, err := RunExternal(ctx, ro)
			if err != nil {
				return Comparison{}, err
			}
			if raw {
				rd.Raw = r
			} else {
				rd.SDK = r
			}
		}
		c.Rounds = append(c.Rounds, rd)
	}
	c.summarize()
	return c, nil
}

// summarize sets the medians from the rounds.
func (c *Comparison) summarize() {
	var ratios, sdkFirst, rawFirst []float64
	for _, rd := range c.Rounds {
		if rd.Raw.Receipt.PerSecond > 0 {
			ratios = append(ratios, rd.SDK.Receipt.PerSecond/rd.Raw.Receipt.PerSecond)
		}
		if f := rd.SDK.FirstWindow.Relative; f > 0 {
			sdkFirst = append(sdkFirst, f)
		}
		if f := rd.Raw.FirstWindow.Relative; f > 0 {
			rawFirst = append(rawFirst, f)
		}
	}
	c.Ratio, c.SDKFirst, c.RawFirst = median(ratios), median(sdkFirst), median(rawFirst)
}

// Table renders the comparison: a line per run and the medians, then the
// last round's two reports in full.
func (c Comparison) Table() string {
	var b strings.Builder
	if len(c.Rounds) == 0 {
		return "no rounds\n"
	}
	last := c.Rounds[len(c.Rounds)-1]
	b.WriteString(last.SDK.Machine.String() + "\n")
	fmt.Fprintf(&b, "deployment: nats-server, ingest, projector and %d worker processes, each a process of its own, "+
		"a fresh deployment for each run; the workers read every receipt, the projector runs\n", last.SDK.Workers)
	fmt.Fprintf(&b, "load: %s events over %s new tasks a run, %d-byte JSON payloads; SDK and raw runs alternate\n",
		group(int64(last.SDK.Events)), group(int64(last.SDK.Tasks)), len(payload(10)))
	cells := [][]string{{"round", "path", "events/s", "first second", "after it", "first/rest", "CPU/event", "workers' CPU/event"}}
	for i, rd := range c.Rounds {
		for _, r := range []ExternalReport{rd.SDK, rd.Raw} {
			path := "SDK"
			if r.Raw {
				path = "raw"
			}
			cells = append(cells, []string{fmt.Sprint(i + 1), path, group(int64(r.Receipt.PerSecond + 0.5)),
				perSecondCell(r.FirstWindow), perSecondCell(r.AfterFirstWindow), ratioCell(r.FirstWindow.Relative),
				formatMicros(r.Total.PerEvent), formatMicros(workersPerEvent(r))})
		}
	}
	writeColumns(&b, cells)
	fmt.Fprintf(&b, "SDK / raw, median of %d rounds: %.2f; first second / the rest, medians: SDK %s, raw %s\n",
		len(c.Rounds), c.Ratio, ratioCell(c.SDKFirst), ratioCell(c.RawFirst))
	return b.String()
}

// Print writes Table to w.
func (c Comparison) Print(w io.Writer) error {
	_, err := io.WriteString(w, c.Table())
	return err
}

func perSecondCell(r Row) string {
	if r.Label == "" {
		return "-"
	}
	return group(int64(r.PerSecond + 0.5))
}

func ratioCell(f float64) string {
	if f == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", f)
}

// workersPerEvent is the worker processes' CPU time per event.
func workersPerEvent(r ExternalReport) (d time.Duration) {
	for _, c := range r.Components {
		if c.Name == ComponentWorkers {
			return c.PerEvent
		}
	}
	return 0
}
