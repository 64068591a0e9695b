// Package grafana_test checks the Grafana dashboard of this folder and the
// alert rules of ../prometheus against the metrics the ledger's services
// really expose: every metric and label they name exists.
package grafana_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/flowness/ledger/internal/admin"
	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// exposed is what the services' /metrics show: each metric family's
// label names.
type exposed map[string]map[string]bool

// scrape reads a /metrics page into x.
func (x exposed) scrape(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	require.NoError(t, err)
	for name, mf := range families {
		labels := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		// A histogram is queried by its series.
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			x[name+"_sum"], x[name+"_count"] = labels, labels
			bucket := map[string]bool{"le": true}
			for l := range labels {
				bucket[l] = true
			}
			x[name+"_bucket"] = bucket
			continue
		}
		x[name] = labels
	}
}

// services runs the ingest and the projector with their metrics served
// as cmd/ingest and cmd/projector serve them, drives them through every
// series the dashboard shows (a vector appears in /metrics only once it
// has a value), and returns what they expose.
func services(t *testing.T) exposed {
	db := dbtest.New(t)
	ns := natstest.Start(t)
	proxy := faultproxy.Start(t, "127.0.0.1:5432")
	store, err := fence.New(db.PoolVia(t, proxy.Addr()), fence.Config{})
	require.NoError(t, err)
	inReg, projReg := admin.NewRegistry(), admin.NewRegistry()
	in, err := ingest.New(ingest.Config{}, ingest.Deps{NC: ns.Conn(t), Store: store, Logger: ledgertest.Logger(), Registerer: inReg})
	require.NoError(t, err)
	require.NoError(t, in.Start(context.Background()))
	t.Cleanup(in.Stop)
	proj, err := projector.New(projector.Config{}, projector.Deps{NC: ns.Conn(t), Pool: db.Pool, Logger: ledgertest.Logger(), Registerer: projReg})
	require.NoError(t, err)
	require.NoError(t, proj.Start(context.Background()))
	t.Cleanup(proj.Stop)
	inAdmin, err := admin.Start("127.0.0.1:0", inReg, nil, ledgertest.Logger())
	require.NoError(t, err)
	t.Cleanup(inAdmin.Stop)
	projAdmin, err := admin.Start("127.0.0.1:0", projReg, nil, ledgertest.Logger())
	require.NoError(t, err)
	t.Cleanup(projAdmin.Stop)

	// Lease requests through the lease service, a takeover included.
	nc := ns.Conn(t)
	subj := wire.Subjects{}
	acquire := func(holder string) {
		_, err := nc.Request(subj.Lease(wire.LeaseAcquire, holder), []byte(`{"partition":1,"ttl_ms":100000}`), 5*time.Second)
		require.NoError(t, err)
	}
	acquire("worker-a.1")
	ledgertest.ExpireLease(t, db.Pool, 1)
	acquire("worker-b.1")
	js := ns.JetStream(t)
	publish := func(version int64, gen int64, holder string) {
		_, err := js.PublishMsg(context.Background(), subj.InboundMsg(wire.Inbound{ID: ledgertest.NewID(), Partition: 1,
			Task: "t-1", Holder: holder, Generation: gen, Version: version, Type: "running", Payload: []byte(`{}`)}))
		require.NoError(t, err)
	}
	publish(1, 2, "worker-b.1") // committed
	publish(2, 1, "worker-a.1") // stale
	require.Eventually(t, func() bool {
		return ledgertest.Count(t, db.Pool, `SELECT count(*) FROM ledger.events`) == 1 &&
			ledgertest.Count(t, db.Pool, `SELECT count(*) FROM ledger.rejections`) == 1
	}, 20*time.Second, 10*time.Millisecond)
	// A database cut makes the ingest retry.
	proxy.Cut()
	publish(2, 2, "worker-b.1")
	x := exposed{}
	require.Eventually(t, func() bool {
		x = exposed{}
		x.scrape(t, "http://"+inAdmin.Addr()+"/metrics")
		return x["ledger_ingest_retries_total"] != nil
	}, 20*time.Second, 50*time.Millisecond, "the ingest never retried")
	proxy.Restore()
	require.Eventually(t, func() bool {
		return ledgertest.Count(t, db.Pool, `SELECT count(*) FROM ledger.events`) == 2
	}, 20*time.Second, 10*time.Millisecond)

	x = exposed{}
	require.Eventually(t, func() bool {
		x = exposed{}
		x.scrape(t, "http://"+projAdmin.Addr()+"/metrics")
		return x["ledger_projector_events_total"] != nil
	}, 20*time.Second, 50*time.Millisecond)
	x.scrape(t, "http://"+inAdmin.Addr()+"/metrics")
	return x
}

// Prometheus attaches these to every series it scrapes.
var targetLabels = []string{"instance", "job"}

var (
	metricRef = regexp.MustCompile(`\b(ledger_[a-z0-9_]+)\b(\{([^}]*)\})?`)
	matcher   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	grouping  = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	strLit    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
)

// check reports every metric or label of a PromQL expression that the
// services do not expose.
func (x exposed) check(t *testing.T, where, expr string) []string {
	t.Helper()
	var used []string
	for _, m := range metricRef.FindAllStringSubmatch(expr, -1) {
		name := m[1]
		labels, ok := x[name]
		require.Truef(t, ok, "%s: metric %s is not exposed by the ingest or the projector", where, name)
		used = append(used, name)
		for _, l := range matcher.FindAllStringSubmatch(strLit.ReplaceAllString(m[3], `""`), -1) {
			require.Truef(t, labels[l[1]] || slices.Contains(targetLabels, l[1]),
				"%s: metric %s has no label %q", where, name, l[1])
		}
	}
	require.NotEmptyf(t, used, "%s: %q names no ledger metric", where, expr)
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			l = strings.TrimSpace(l)
			found := slices.Contains(targetLabels, l)
			for _, name := range used {
				found = found || x[name][l]
			}
			require.Truef(t, found, "%s: grouping by %q, a label none of %v has", where, l, used)
		}
	}
	return used
}

type dashboard struct {
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Title      string `json:"title"`
	Type       string `json:"type"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

type rules struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// The dashboard and the alert rules name only metrics and labels the
// ingest and the projector expose, and the dashboard shows every one of
// the ledger's metrics.
func TestDashboardAndAlertsUseTheServicesMetrics(t *testing.T) {
	t.Parallel()
	x := services(t)

	b, err := os.ReadFile("ledger.json")
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(b, &d))
	shown := map[string]bool{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotNil(t, p.Datasource, "panel %q has no data source", p.Title)
		require.Equal(t, "${datasource}", p.Datasource.UID, "panel %q", p.Title)
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, target := range p.Targets {
			for _, name := range x.check(t, "panel "+p.Title, target.Expr) {
				shown[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")] = true
			}
		}
	}
	for name := range x {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if strings.HasPrefix(name, "ledger_") {
			require.Truef(t, shown[base], "the dashboard shows nothing of %s", base)
		}
	}

	b, err = os.ReadFile("../prometheus/ledger-alerts.yml")
	require.NoError(t, err)
	var r rules
	require.NoError(t, yaml.Unmarshal(b, &r))
	alerted := map[string]bool{}
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			require.NotEmpty(t, rule.Alert)
			require.Contains(t, []string{"warning", "critical"}, rule.Labels["severity"], rule.Alert)
			require.NotEmpty(t, rule.Annotations["summary"], rule.Alert)
			for _, name := range x.check(t, "alert "+rule.Alert, rule.Expr) {
				alerted[name] = true
			}
		}
	}
	// What the issue asks the alerts to watch: lease churn, dead letters by
	// verdict, projector lag and gap age.
	for _, name := range []string{"ledger_lease_takeovers_total", "ledger_ingest_events_total",
		"ledger_projector_lag_seconds", "ledger_projector_oldest_gap_seconds"} {
		require.Truef(t, alerted[name], "no alert watches %s", name)
	}
}
