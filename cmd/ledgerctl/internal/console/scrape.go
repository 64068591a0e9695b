package console

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/flowness/ledger/pkg/wire"
)

// ingestEventsMetric is the ingest's count of verdicts
// (internal/ingest/metrics.go).
const ingestEventsMetric = "ledger_ingest_events_total"

// scrapeTimeout bounds one read of an ingest's /metrics.
const scrapeTimeout = 2 * time.Second

// maxScrapeBytes bounds one /metrics answer read: an ingest's is a few
// tens of KiB.
const maxScrapeBytes = 4 << 20

// scrape reads every ingest's verdict counters and adds what rose since
// the last scrape to the current second: the duplicates, which only the
// ingest knows of. The first scrape of an ingest only sets its baseline.
func (h *hub) scrape(ctx context.Context, now time.Time, p *problems) {
	for _, url := range h.cfg.IngestMetrics {
		counts, err := h.scrapeOne(ctx, url)
		if err != nil {
			p.flow = append(p.flow, h.problem("scrape "+url, "an ingest's metrics could not be read (the console's log says which and why)", err))
			continue
		}
		h.mu.Lock()
		prev, had := h.flow.scraped[url]
		h.flow.scraped[url] = counts
		for k, n := range counts {
			if k.verdict != string(wire.VerdictDuplicate) || !had {
				continue
			}
			// A counter below its last value was reset: the ingest restarted.
			rise := n - prev[k]
			if rise < 0 {
				rise = n
			}
			s := h.flow.duplicates[k.reason]
			if s == nil {
				s = series{}
				h.flow.duplicates[k.reason] = s
			}
			s.add(now.Unix(), int64(rise))
		}
		h.mu.Unlock()
	}
}

func (h *hub) scrapeOne(ctx context.Context, url string) (map[verdictReason]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := h.scraper.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseIngestEvents(io.LimitReader(resp.Body, maxScrapeBytes))
}

// parseIngestEvents reads ledger_ingest_events_total by verdict and reason
// from a Prometheus text exposition.
func parseIngestEvents(r io.Reader) (map[verdictReason]float64, error) {
	families, err := parseMetrics(r)
	if err != nil {
		return nil, err
	}
	out := map[verdictReason]float64{}
	mf, ok := families[ingestEventsMetric]
	if !ok {
		return out, nil
	}
	for _, m := range mf.GetMetric() {
		var k verdictReason
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "verdict":
				k.verdict = l.GetValue()
			case "reason":
				k.reason = l.GetValue()
			}
		}
		if c := m.GetCounter(); c != nil {
			out[k] += c.GetValue()
		} else if u := m.GetUntyped(); u != nil {
			out[k] += u.GetValue()
		}
	}
	return out, nil
}

// parseMetrics reads a Prometheus text exposition.
func parseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return families, nil
}
