package console

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// recount is how far back each snapshot counts commits again. A commit is
// stamped when its row is inserted and becomes visible when its
// transaction commits, a batch later: the seconds of the last recount are
// counted again until every transaction stamped in them has committed.
const recount = 10 * time.Second

// bootstrapRows bounds the events the first snapshot reads to fill the
// window: at most this many of the newest.
const bootstrapRows = 1_000_000

// rateOver is the time a "per second" rate is averaged over.
const rateOver = 10 * time.Second

// verdictsShown are the verdicts the flow view charts, in this order.
var verdictsShown = []string{string(wire.VerdictCommitted), string(wire.VerdictDuplicate),
	string(wire.VerdictStale), string(wire.VerdictConflict), string(wire.VerdictGap), string(wire.VerdictInvalid)}

// flowState is what the flow view accumulates between snapshots.
type flowState struct {
	commits series
	// marks are heads seen, oldest first: (database time, head).
	marks []headMark
	// counted is set once the window was filled.
	counted bool
	// rejected counts dead letters per verdict and reason; duplicates
	// the ingests' duplicate verdicts per reason, from their metrics.
	rejected   map[verdictReason]series
	duplicates map[string]series
	scraped    map[string]map[verdictReason]float64
	scrapedAt  bool
}

type headMark struct {
	at   time.Time
	head int64
}

type verdictReason struct{ verdict, reason string }

func newFlowState() flowState {
	return flowState{commits: series{}, rejected: map[verdictReason]series{}, duplicates: map[string]series{},
		scraped: map[string]map[verdictReason]float64{}}
}

// floor is a position below every event stamped at t or later: the head
// seen at least a second before t (sequences are drawn at insert time).
// Without one old enough it is fallback.
func (f *flowState) floor(t time.Time, fallback int64) int64 {
	floor := int64(-1)
	for _, m := range f.marks {
		if m.at.After(t.Add(-time.Second)) {
			break
		}
		floor = m.head
	}
	if floor < 0 {
		return max(fallback-bootstrapRows, 0)
	}
	return floor
}

// chart is one verdict's flow.
type chart struct {
	Verdict    string
	Total      int64
	LastMinute int64
	PerSecond  float64
	Points     string
	Peak       int64
	Reasons    []reasonRow
	// Note says where the numbers come from, or why there are none.
	Note string
}

type reasonRow struct {
	Reason            string
	LastMinute, Total int64
}

// lagRow is one projector consumer's position on LEDGER_LOG.
type lagRow struct {
	Consumer string
	// Behind counts the log messages it has not acked.
	Behind   uint64
	AckFloor uint64
	LastSeq  uint64
	// OldestMS is the age of the oldest message it has not acked; -1 when
	// none.
	OldestMS int64
}

type gapView struct {
	Open           int
	OldestTask     string
	OldestConsumer string
	OldestMS       int64
	Known          bool
}

type flowView struct {
	Window     time.Duration
	Charts     []chart
	Projectors []lagRow
	Gaps       gapView
	Problems   []string
}

func (h *hub) flowView(ctx context.Context, now time.Time, head int64, p *problems) flowView {
	v := flowView{Window: h.cfg.FlowWindow}
	if head >= 0 {
		if err := h.countCommits(ctx, now, head); err != nil {
			p.flow = append(p.flow, h.problem("count commits", "commits could not be counted (the console's log says why)", err))
		}
	}
	if len(h.cfg.IngestMetrics) > 0 {
		h.scrape(ctx, now, p)
	}
	h.mu.Lock()
	h.trimFlow(now)
	v.Charts = h.charts(now)
	h.mu.Unlock()
	v.Projectors = h.projectorLag(ctx, p)
	v.Gaps = h.gapView()
	h.mu.Lock()
	if h.dlq.problem != "" {
		p.flow = append(p.flow, h.dlq.problem)
	}
	if h.gaps.problem != "" {
		p.flow = append(p.flow, h.gaps.problem)
	}
	h.mu.Unlock()
	return v
}

// countCommits counts again the commits of the last seconds (the whole
// window the first time) and forgets those older than the window.
func (h *hub) countCommits(ctx context.Context, now time.Time, head int64) error {
	h.mu.Lock()
	since := now.Add(-recount)
	if !h.flow.counted {
		since = now.Add(-h.cfg.FlowWindow)
	}
	floor := h.flow.floor(since, head)
	h.mu.Unlock()

	rows, err := h.deps.Pool.Query(ctx, sqlCommitsPerSecond, floor, since)
	if err != nil {
		return fmt.Errorf("count commits since %s: %w", since.Format(time.RFC3339), err)
	}
	counted := series{}
	var sec, n int64
	if _, err := pgx.ForEachRow(rows, []any{&sec, &n}, func() error {
		counted[sec] = n
		return nil
	}); err != nil {
		return fmt.Errorf("count commits since %s: %w", since.Format(time.RFC3339), err)
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	f := &h.flow
	// A second that straddles since was only partly counted: keep the
	// larger count.
	first := since.Unix()
	for sec := range f.commits {
		if sec > first {
			delete(f.commits, sec)
		}
	}
	for sec, n := range counted {
		if sec == first {
			n = max(n, f.commits[sec])
		}
		f.commits[sec] = n
	}
	f.counted = true
	f.marks = append(f.marks, headMark{at: now, head: head})
	// Keep the marks a floor may still need.
	keep := 0
	for keep < len(f.marks)-1 && f.marks[keep+1].at.Before(now.Add(-recount-5*time.Second)) {
		keep++
	}
	f.marks = f.marks[keep:]
	h.trimFlow(now)
	return nil
}

// trimFlow forgets the seconds before the window. Called with h.mu held.
func (h *hub) trimFlow(now time.Time) {
	from := now.Add(-h.cfg.FlowWindow).Unix()
	h.flow.commits.trim(from)
	// Keys come from dead letters' headers: an emptied one goes, so that
	// odd reasons cannot pile up.
	for k, s := range h.flow.rejected {
		if s.trim(from); len(s) == 0 {
			delete(h.flow.rejected, k)
		}
	}
	for k, s := range h.flow.duplicates {
		if s.trim(from); len(s) == 0 {
			delete(h.flow.duplicates, k)
		}
	}
}

// charts draws the flow of each verdict. Called with h.mu held.
func (h *hub) charts(now time.Time) []chart {
	to := now.Unix()
	from := now.Add(-h.cfg.FlowWindow).Unix() + 1
	minute := to - 59
	rateFrom := to - int64(rateOver/time.Second) + 1
	var out []chart
	for _, verdict := range verdictsShown {
		c := chart{Verdict: verdict}
		var all []series
		switch verdict {
		case string(wire.VerdictCommitted):
			all = []series{h.flow.commits}
			c.Note = "rows of ledger.events by committed_at"
		case string(wire.VerdictDuplicate):
			if len(h.cfg.IngestMetrics) == 0 {
				c.Note = "not shown: duplicates leave no row and no dead letter; start the console with -ingest-metrics <the ingest's /metrics URL> to count them"
			} else {
				c.Note = "from the ingests' ledger_ingest_events_total, since the console started"
			}
			for _, reason := range slices.Sorted(maps.Keys(h.flow.duplicates)) {
				s := h.flow.duplicates[reason]
				all = append(all, s)
				c.Reasons = append(c.Reasons, reasonRow{Reason: reason, LastMinute: s.sum(minute, to), Total: s.sum(from, to)})
			}
		default:
			c.Note = "dead letters in LEDGER_DLQ by Ledger-Rejected-At"
			var keys []verdictReason
			for k := range h.flow.rejected {
				if k.verdict == verdict {
					keys = append(keys, k)
				}
			}
			slices.SortFunc(keys, func(a, b verdictReason) int { return strings.Compare(a.reason, b.reason) })
			for _, k := range keys {
				s := h.flow.rejected[k]
				all = append(all, s)
				c.Reasons = append(c.Reasons, reasonRow{Reason: k.reason, LastMinute: s.sum(minute, to), Total: s.sum(from, to)})
			}
		}
		for _, s := range all {
			c.Total += s.sum(from, to)
			c.LastMinute += s.sum(minute, to)
			c.PerSecond += float64(s.sum(rateFrom, to)) / rateOver.Seconds()
		}
		c.Points, c.Peak = points(from, to, all...)
		out = append(out, c)
	}
	return out
}

// projectorLag reads each projector consumer's ack floor on LEDGER_LOG:
// the durable "projector", or "projector-<set>" when the log is split.
func (h *hub) projectorLag(ctx context.Context, p *problems) []lagRow {
	s, err := h.deps.JS.Stream(ctx, wire.StreamLog)
	if err != nil {
		p.flow = append(p.flow, h.problem("open LEDGER_LOG", "LEDGER_LOG could not be read: has the ingest created it? (the console's log says why)", err))
		return nil
	}
	last := s.CachedInfo().State.LastSeq
	var rows []lagRow
	list := s.ListConsumers(ctx)
	for ci := range list.Info() {
		if ci.Name != "projector" && !strings.HasPrefix(ci.Name, "projector-") {
			continue
		}
		r := lagRow{Consumer: ci.Name, Behind: ci.NumPending + uint64(ci.NumAckPending), AckFloor: ci.AckFloor.Stream,
			LastSeq: last, OldestMS: -1}
		if r.Behind > 0 {
			r.OldestMS = h.oldestUnacked(ctx, s, ci)
		}
		rows = append(rows, r)
	}
	if err := list.Err(); err != nil {
		p.flow = append(p.flow, h.problem("list LEDGER_LOG consumers", "the projector's consumers could not be listed (the console's log says why)", err))
	}
	slices.SortFunc(rows, func(a, b lagRow) int { return strings.Compare(a.Consumer, b.Consumer) })
	return rows
}

// oldestUnacked is the age of the first log message after the consumer's
// ack floor that it is meant to read; -1 if unknown.
func (h *hub) oldestUnacked(ctx context.Context, s jetstream.Stream, ci *jetstream.ConsumerInfo) int64 {
	filters := ci.Config.FilterSubjects
	if ci.Config.FilterSubject != "" {
		filters = append(filters, ci.Config.FilterSubject)
	}
	if len(filters) == 0 {
		filters = []string{h.deps.Subjects.LogAll()}
	}
	var oldest *jetstream.RawStreamMsg
	for _, f := range filters {
		m, err := s.GetMsg(ctx, ci.AckFloor.Stream+1, jetstream.WithGetMsgSubject(f))
		if err != nil {
			continue
		}
		if oldest == nil || m.Sequence < oldest.Sequence {
			oldest = m
		}
	}
	if oldest == nil {
		return -1
	}
	return max(time.Since(oldest.Time).Milliseconds(), 0)
}
