package benchreport

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// stageMetric is the ingest's histogram of where an event's time to its
// receipt goes (docs/operations.md).
const stageMetric = "ledger_ingest_stage_seconds"

// StageRow is one stage of the ingest's ledger_ingest_stage_seconds over a
// latency run's path phases: how many it counted, their mean, and the
// upper bounds of the buckets that hold the 50th and 99th percentiles.
type StageRow struct {
	Stage string        `json:"stage"`
	Count uint64        `json:"count"`
	Mean  time.Duration `json:"mean"`
	P50   time.Duration `json:"p50_at_most"`
	P99   time.Duration `json:"p99_at_most"`
}

// stageHist is one stage's histogram as scraped: its count, sum, and the
// cumulative count at each bucket's upper bound.
type stageHist struct {
	count  uint64
	sum    float64
	bounds []float64
	cum    []uint64
}

// scrapeStages reads the stage histograms from the ingest's /metrics at
// addr. An ingest that has none (a build from before them) gives none.
func scrapeStages(ctx context.Context, addr string) (map[string]stageHist, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("benchreport: the ingest's metrics: %w", err)
	}
	defer resp.Body.Close() //nolint:errcheck
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("benchreport: the ingest's metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("benchreport: the ingest's metrics: %w", err)
	}
	out := map[string]stageHist{}
	for _, m := range fams[stageMetric].GetMetric() {
		var stage string
		for _, l := range m.GetLabel() {
			if l.GetName() == "stage" {
				stage = l.GetValue()
			}
		}
		h := m.GetHistogram()
		sh := stageHist{count: h.GetSampleCount(), sum: h.GetSampleSum()}
		for _, b := range h.GetBucket() {
			sh.bounds = append(sh.bounds, b.GetUpperBound())
			sh.cum = append(sh.cum, b.GetCumulativeCount())
		}
		out[stage] = sh
	}
	return out, nil
}

// since is what h counted after earlier, a scrape of the same histogram.
func (h stageHist) since(earlier stageHist) stageHist {
	d := stageHist{count: h.count - earlier.count, sum: h.sum - earlier.sum, bounds: h.bounds, cum: slices.Clone(h.cum)}
	if slices.Equal(h.bounds, earlier.bounds) {
		for i := range d.cum {
			d.cum[i] -= earlier.cum[i]
		}
	}
	return d
}

// plus adds o, a histogram with the same buckets, to h.
func (h stageHist) plus(o stageHist) stageHist {
	if h.count == 0 && len(h.cum) == 0 {
		return o
	}
	s := stageHist{count: h.count + o.count, sum: h.sum + o.sum, bounds: h.bounds, cum: slices.Clone(h.cum)}
	for i := range s.cum {
		if i < len(o.cum) {
			s.cum[i] += o.cum[i]
		}
	}
	return s
}

// atMost is the upper bound of the bucket that holds the q-th quantile
// (0 < q < 1): the quantile is at most that. Past the last bucket it is
// +Inf, given as the largest duration.
func (h stageHist) atMost(q float64) time.Duration {
	if h.count == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.count)))
	for i, c := range h.cum {
		if c >= rank {
			return time.Duration(h.bounds[i] * float64(time.Second))
		}
	}
	return time.Duration(math.MaxInt64)
}

// stageRows orders the stages as the ingest passes through them.
func stageRows(hs map[string]stageHist) []StageRow {
	var rows []StageRow
	for _, name := range []string{"delivery", "queue", "append", "handoff", "copies", "receipt"} {
		h, ok := hs[name]
		if !ok || h.count == 0 {
			continue
		}
		rows = append(rows, StageRow{Stage: name, Count: h.count,
			Mean: time.Duration(h.sum / float64(h.count) * float64(time.Second)),
			P50:  h.atMost(0.5), P99: h.atMost(0.99)})
	}
	return rows
}
