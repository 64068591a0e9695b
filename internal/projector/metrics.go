package projector

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/flowness/ledger/pkg/projection"
)

// metrics are the projector's Prometheus series. With a nil registerer they
// are kept but exposed nowhere.
type metrics struct {
	events       *prometheus.CounterVec
	lag          prometheus.Gauge
	openGaps     prometheus.Gauge
	oldestGap    prometheus.Gauge
	buffered     prometheus.Gauge
	refetches    prometheus.Counter
	refetched    prometheus.Counter
	kvWrites     prometheus.Counter
	kvRetries    prometheus.Counter
	withoutData  prometheus.Counter
	kvRefused    prometheus.Counter
	heldTasks    prometheus.Gauge
	loadFailures prometheus.Counter
	tasksInMem   prometheus.Gauge
	reconciled   prometheus.Counter
	refusals     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	g := func(name, help string) prometheus.Gauge {
		return f.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return f.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	return &metrics{
		events: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_projector_events_total", Help: "Committed events offered to the engine, by outcome (applied, buffered, duplicate, conflict, ...).",
		}, []string{"outcome"}),
		lag:         g("ledger_projector_lag_seconds", "Time from the commit of the last event handled to its handling."),
		openGaps:    g("ledger_projector_open_gaps", "Tasks waiting for a missing version."),
		oldestGap:   g("ledger_projector_oldest_gap_seconds", "Age of the oldest open gap."),
		buffered:    g("ledger_projector_buffered_events", "Early versions held until the versions before them arrive."),
		refetches:   c("ledger_projector_refetches_total", "Re-fetch requests answered from PostgreSQL."),
		refetched:   c("ledger_projector_refetched_events_total", "Events read back from PostgreSQL by re-fetches."),
		kvWrites:    c("ledger_projector_kv_writes_total", "Projection values written to the bucket."),
		kvRetries:   c("ledger_projector_kv_retries_total", "Bucket writes retried (lost compare-and-set or transient failure)."),
		withoutData: c("ledger_projector_values_without_data_total", "Projection values written with data null and data_too_large, their data being too large for a bucket value."),
		kvRefused: c("ledger_projector_kv_refused_total",
			"Bucket writes refused for lack of space (bucket max_bytes or server storage); the task is held and written later."),
		heldTasks:    g("ledger_projector_held_tasks", "Tasks whose latest state the bucket refused and that wait to be written."),
		loadFailures: c("ledger_projector_load_failures_total", "Stored projections that could not be read; the events that needed them are redelivered."),
		tasksInMem:   g("ledger_projector_tasks_in_memory", "Tasks the engine holds."),
		reconciled: c("ledger_projector_reconciled_total",
			"Projections found behind their task's head in PostgreSQL (a log copy or a bucket value JetStream lost) and folded again."),
		refusals: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_refusals_total",
			Help: "Projection values written without their data for a principal over its share of ledger_tasks (path projection, reason quota).",
		}, []string{"path", "principal", "reason"}),
	}
}

// refused counts a value of principal's written without its data for its
// quota. Principals come from the committed log, so from NATS users.
func (m *metrics) refused(principal string) {
	m.refusals.WithLabelValues("projection", principal, "quota").Inc()
}

func (m *metrics) outcome(o projection.Outcome) { m.events.WithLabelValues(string(o)).Inc() }
