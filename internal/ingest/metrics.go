package ingest

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// metrics are the ingest's Prometheus series. With a nil registerer they
// are kept but exposed nowhere.
type metrics struct {
	events    *prometheus.CounterVec
	batchSize prometheus.Histogram
	batchTime prometheus.Histogram
	// stageTimes are ledger_ingest_stage_seconds' series, by stage.
	stageTimes [stageCount]prometheus.Observer
	retries    *prometheus.CounterVec
	leaseOps   *prometheus.CounterVec
	takeovers  prometheus.Counter
	refusals   *prometheus.CounterVec
	labels     principalLabels
	claims     prometheus.Gauge
	durable    *prometheus.GaugeVec
	// wouldReject counts commits under the observe fence mode that
	// enforce would have refused (docs/contract.md §13).
	wouldReject *prometheus.CounterVec
	// tailRestored counts LEDGER_LOG copies the tail check published
	// again (logtail.go): copies the stream had acked and then lost.
	tailRestored prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		events: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_ingest_events_total", Help: "Inbound events by final verdict and reason.",
		}, []string{"verdict", "reason"}),
		batchSize: f.NewHistogram(prometheus.HistogramOpts{
			Name: "ledger_ingest_batch_size", Help: "Messages per processed batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}),
		batchTime: f.NewHistogram(prometheus.HistogramOpts{
			Name: "ledger_ingest_batch_seconds", Help: "Time from a batch's start to its acks: append, copies, receipts.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		retries: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_ingest_retries_total", Help: "Transient failures retried, by operation (append, publish, log_order).",
		}, []string{"op"}),
		leaseOps: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_lease_requests_total", Help: "Lease service requests by endpoint and outcome (ok or error code); acquire outcomes include takeovers.",
		}, []string{"endpoint", "outcome"}),
		refusals: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_refusals_total",
			Help: "Requests and events refused or cut for a principal over its share, by path (a lease endpoint, dead_letter), principal and reason (rate_limited, busy, stale, quota).",
		}, []string{"path", "principal", "reason"}),
		takeovers: f.NewCounter(prometheus.CounterOpts{
			Name: "ledger_lease_takeovers_total",
			Help: "Grants that replaced an earlier lease (an expired one, or the holder's own earlier incarnation): every grant of generation 2 and above.",
		}),
		durable: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledger_postgres_durability", Help: "1 for the durability the database offers now (none, local or sync), 0 for the others.",
		}, []string{"level"}),
		wouldReject: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_ingest_would_reject_total",
			Help: "Events committed under the observe fence mode that enforce would have refused, by what it would have answered (stale/<reason>).",
		}, []string{"would_reject"}),
		tailRestored: f.NewCounter(prometheus.CounterOpts{
			Name: "ledger_ingest_log_copies_restored_total",
			Help: "LEDGER_LOG copies of committed events published again from PostgreSQL because the stream had lost them (a NATS restart that lost its unsynced tail).",
		}),
		claims: f.NewGauge(prometheus.GaugeOpts{
			Name: "ledger_ingest_partitions", Help: "Partitions this ingest decides now (its claims).",
		}),
	}
	stageVec := f.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ledger_ingest_stage_seconds",
		Help:    "Where an event's time to its receipt goes, by stage: delivery (JetStream stored it → this ingest took it), queue (→ its first batch began), append, handoff and copies (its batch's, counted for each of the batch's events: the fenced append with its retries; the wait for the lane's earlier batches' copies; storing the batch's LEDGER_LOG and LEDGER_DLQ copies), receipt (JetStream stored it → its receipt was sent).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"stage"})
	for st, name := range stageNames {
		m.stageTimes[st] = stageVec.WithLabelValues(name)
	}
	return m
}

// watchAppends exposes the store's fast-path counts (fence.Store.FastPath)
// as counters read at each scrape.
func watchAppends(reg prometheus.Registerer, store *fence.Store) {
	f := promauto.With(reg)
	f.NewCounterFunc(prometheus.CounterOpts{
		Name: "ledger_ingest_fast_appends_total",
		Help: "Append attempts sent in one round trip, their outcome predicted from cached heads and leases.",
	}, func() float64 { a, _ := store.FastPath(); return float64(a) })
	f.NewCounterFunc(prometheus.CounterOpts{
		Name: "ledger_ingest_fast_append_misses_total",
		Help: "Of those, the ones whose prediction missed (a zombie's batch, an id with a recorded verdict, a head moved elsewhere): decided again from the database.",
	}, func() float64 { _, m := store.FastPath(); return float64(m) })
}

func (m *metrics) verdict(v wire.Verdict, reason, wouldReject string) {
	m.events.WithLabelValues(string(v), reason).Inc()
	if wouldReject != "" {
		m.wouldReject.WithLabelValues(wouldReject).Inc()
	}
}

func (m *metrics) batch(n int, d time.Duration) {
	m.batchSize.Observe(float64(n))
	m.batchTime.Observe(d.Seconds())
}

// The stages of ledger_ingest_stage_seconds.
type stage int

const (
	stageDelivery stage = iota
	stageQueue
	stageAppend
	stageHandoff
	stageCopies
	stageReceipt
	stageCount
)

var stageNames = [stageCount]string{"delivery", "queue", "append", "handoff", "copies", "receipt"}

func (m *metrics) stage(st stage, d time.Duration) { m.stages(st, d, 1) }

// stages counts a batch's stage once for each of its n events, so that an
// event's stages add up to its receipt's time: a mean over batches would
// weigh a batch of 1 as one of 500.
func (m *metrics) stages(st stage, d time.Duration, n int) {
	v := max(d, 0).Seconds()
	for range n {
		m.stageTimes[st].Observe(v)
	}
}

// queued counts the batch's events' delivery and queue stages, each
// event's once: an event that waits for an earlier version is in several
// batches. A message without JetStream's metadata has no delivery stage.
func (m *metrics) queued(batch []*inbound, started time.Time) {
	for _, in := range batch {
		if in.queued || in.received.IsZero() {
			continue
		}
		in.queued = true
		if !in.published.IsZero() {
			m.stage(stageDelivery, in.received.Sub(in.published))
		}
		m.stage(stageQueue, started.Sub(in.received))
	}
}

func (m *metrics) retry(op string) { m.retries.WithLabelValues(op).Inc() }

func (m *metrics) lease(endpoint, outcome string) {
	m.leaseOps.WithLabelValues(endpoint, outcome).Inc()
}

func (m *metrics) takeover() { m.takeovers.Inc() }

// refused counts a refusal of principal's on path.
func (m *metrics) refused(path, principal, reason string) {
	m.refusals.WithLabelValues(path, m.labels.of(principal), reason).Inc()
}

// maxPrincipalLabels bounds the principals named on /metrics; the others
// are counted as "_other". Without authentication principals are made up
// by whoever sends, and every one named would be a series.
const maxPrincipalLabels = 1000

type principalLabels struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (l *principalLabels) of(principal string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	if !l.seen[principal] && len(l.seen) >= maxPrincipalLabels {
		return "_other"
	}
	l.seen[principal] = true
	return principal
}

func (m *metrics) durability(l fence.DurabilityLevel) {
	for _, x := range []fence.DurabilityLevel{fence.DurabilityNone, fence.DurabilityLocal, fence.DurabilitySync} {
		v := 0.0
		if x == l {
			v = 1
		}
		m.durable.WithLabelValues(string(x)).Set(v)
	}
}
