package console

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/projection"
)

// Everything the console decodes comes from outside it: a page's query,
// the buckets, an ingest's /metrics, a lease.get reply, and the dead
// letters' headers and bodies, which workers wrote. Each decoder gives a
// verdict or an error and never panics, and nothing it returns becomes
// markup on a page.

func FuzzParseDLQQuery(f *testing.F) {
	for _, s := range []string{"verdict=stale&reason=superseded", "partition=3&task=report-7&holder=worker-a.1",
		"since=15m&until=2026-01-02T15:04:05Z", "partition=03", "partition=-1", "task=a.b", "since=-5m",
		"verdict=committed", "reason=" + strings.Repeat("x", 300), "since=1e9h", "%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		q, err := parseDLQQuery(v)
		if err != nil {
			return
		}
		if q.Partition < -1 || len(q.Reason) > maxQueryValue {
			t.Fatalf("accepted %q as %+v", raw, q)
		}
		if q.Task != "" && strings.ContainsAny(q.Task, ".*> ") {
			t.Fatalf("task %q would widen the stream filter", q.Task)
		}
		_ = q.match(DeadLetter{Verdict: "stale", RejectedAt: "2026-01-02T15:04:05Z"})
		link := string(q.link("stale", "<b>"))
		if strings.ContainsAny(link, "<>\" ") {
			t.Fatalf("link %q is not encoded", link)
		}
	})
}

func FuzzParseGapMarker(f *testing.F) {
	f.Add("projector.report-7", "2026-01-02T15:04:05.123456789Z")
	f.Add("projector-0-7.invoice-42", "2026-01-02T15:04:05Z")
	f.Add("projector", "2026-01-02T15:04:05Z")
	f.Add("projector.a.b", "yesterday")
	f.Add(".x", "")
	f.Fuzz(func(t *testing.T, key, value string) {
		g, err := parseGapMarker(key, []byte(value))
		if err == nil && (g.consumer == "" || g.task == "" || strings.Contains(g.task, ".")) {
			t.Fatalf("accepted %q as %+v", key, g)
		}
	})
}

func FuzzPartitionCount(f *testing.F) {
	for _, s := range []string{`{"partition":0,"holder":"a.b","generation":1,"partitions":16}`,
		`{"error":"no_lease","partitions":8}`, `{"partitions":1e9}`, `{"partitions":-3}`, `[]`, `{"partitions":"16"}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if n := partitionCountOf(b); n < 0 || n > maxPartitionsShown {
			t.Fatalf("%q gave %d partitions", b, n)
		}
	})
}

func FuzzParseIngestMetrics(f *testing.F) {
	f.Add("# TYPE ledger_ingest_events_total counter\nledger_ingest_events_total{verdict=\"duplicate\",reason=\"same_content\"} 3\n")
	f.Add("ledger_ingest_events_total{verdict=\"committed\",reason=\"\"} 1e3\nledger_ingest_events_total 2\n")
	f.Add("# TYPE ledger_ingest_events_total gauge\nledger_ingest_events_total{verdict=\"x\"} NaN\n")
	f.Add("not metrics {{{")
	f.Fuzz(func(t *testing.T, s string) {
		counts, err := parseIngestEvents(strings.NewReader(s))
		if err == nil && counts == nil {
			t.Fatal("no error and no counts")
		}
	})
}

func FuzzCompareProjection(f *testing.F) {
	f.Add([]byte(`{"task":"t","partition":1,"version":2,"status":"done","data":{"a":1},"seq":7,"updated_at":"2026-01-02T15:04:05Z","gap":null}`), []byte(`{"a":1}`))
	f.Add([]byte(`{"task":"t","version":2,"data":null,"data_too_large":2000000}`), []byte(`{}`))
	f.Add([]byte(`{"gap":{"next_version":3,"since":"2026-01-02T15:04:05Z"}}`), []byte(`null`))
	f.Add([]byte(`"not a projection"`), []byte(`[1,2]`))
	f.Add([]byte(`{"data":{"a":1e999999}}`), []byte(`{"a":1e999999}`))
	f.Fuzz(func(t *testing.T, stored, data []byte) {
		fold := projection.State{Task: "t", Version: 2, Status: "done", Seq: 7}
		if json.Valid(data) {
			fold.Data = data
		}
		c := compareProjection(TaskProjection{Revision: 1, Value: stored}, fold)
		if c.Match && len(c.Differences) > 0 {
			t.Fatalf("a match with differences: %+v", c)
		}
	})
}

// FuzzLetterPage draws a dead letter of hostile headers and body: what a
// worker wrote appears as text, never as an element or an attribute.
func FuzzLetterPage(f *testing.F) {
	f.Add("X-Note", `<img src=x onerror=alert(1)>`, []byte(`<script>alert(2)</script>`), "bad_type")
	f.Add("Ledger-Type", "\"><svg onload=alert(1)>", []byte{0xff, '<', 'b', '>'}, "superseded")
	f.Add("X-\r\nInjected", "a\r\nb\u202e", []byte(`{"html":"<b>x</b>"}`), "</td><td>")
	p, err := loadPages()
	if err != nil {
		f.Fatal(err)
	}
	draw := func(t *testing.T, name, value string, body []byte, reason string) string {
		d := DeadLetter{Seq: 9, Subject: "ledger.dlq.3.report-7", Task: "report-7", Verdict: "stale", Reason: reason,
			EventID: value, Type: value, Holder: value, Header: nats.Header{name: {value}}, Body: body, Unusable: value}
		var buf bytes.Buffer
		if err := p.byName["letter"].ExecuteTemplate(&buf, "layout.html", page{Title: value, Data: newLetterView(d)}); err != nil {
			t.Fatal(err)
		}
		list := &dlqList{Query: dlqQuery{Partition: -1, Form: map[string]string{}}}
		list.add(d, 10)
		if err := p.byName["dlq"].ExecuteTemplate(&buf, "dlq-live", list); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	// Escaped, a value adds no tag and no quote: the page has as many as it
	// has with harmless values in their place.
	markup := func(html string) [3]int {
		return [3]int{strings.Count(html, "<"), strings.Count(html, ">"), strings.Count(html, `"`)}
	}
	f.Fuzz(func(t *testing.T, name, value string, body []byte, reason string) {
		hostile := draw(t, name, value, body, reason)
		plain := draw(t, "X", "v", []byte("b"), "r")
		if markup(hostile) != markup(plain) {
			t.Fatalf("the values added markup: %v tags and quotes, %v with plain values", markup(hostile), markup(plain))
		}
	})
}
