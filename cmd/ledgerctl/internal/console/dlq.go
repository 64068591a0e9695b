package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

// dlqQuery is a dead-letter list's filter, from the page's query.
type dlqQuery struct {
	// Verdict, Reason, Task and Holder match exactly; empty matches all.
	Verdict, Reason, Task, Holder string
	// Partition is -1 for all.
	Partition int
	// Since and Until bound Ledger-Rejected-At; zero: unbounded.
	Since, Until time.Time
	// Form holds the values as typed, to fill the form again.
	Form map[string]string
}

// dlqQueryFields are the query parameters of a dead-letter list.
var dlqQueryFields = []string{"verdict", "reason", "partition", "task", "holder", "since", "until"}

// maxQueryValue bounds one filter value.
const maxQueryValue = 256

// parseDLQQuery reads a filter from a URL query. since and until are a
// time (RFC 3339) or a duration before now ("15m").
func parseDLQQuery(v url.Values) (dlqQuery, error) {
	q := dlqQuery{Partition: -1, Form: map[string]string{}}
	for _, k := range dlqQueryFields {
		val := strings.TrimSpace(v.Get(k))
		if len(val) > maxQueryValue {
			return q, fmt.Errorf("%s is longer than %d characters", k, maxQueryValue)
		}
		q.Form[k] = val
	}
	q.Verdict, q.Reason, q.Task, q.Holder = q.Form["verdict"], q.Form["reason"], q.Form["task"], q.Form["holder"]
	if q.Verdict != "" && !slices.Contains(dlqVerdicts, q.Verdict) {
		return q, fmt.Errorf("verdict %q: dead letters have verdict %s", q.Verdict, strings.Join(dlqVerdicts, ", "))
	}
	if q.Task != "" && !wire.ValidID(q.Task) {
		return q, fmt.Errorf("task %q is not 1..%d characters of [A-Za-z0-9_-]", q.Task, wire.MaxIDLen)
	}
	if p := q.Form["partition"]; p != "" {
		n, err := wire.ParseInt(p)
		if err != nil || n > 1<<30 {
			return q, fmt.Errorf("partition %q is not a partition number", p)
		}
		q.Partition = int(n)
	}
	var err error
	if q.Since, err = parseWhen(q.Form["since"]); err != nil {
		return q, fmt.Errorf("since: %w", err)
	}
	if q.Until, err = parseWhen(q.Form["until"]); err != nil {
		return q, fmt.Errorf("until: %w", err)
	}
	return q, nil
}

// dlqVerdicts are the verdicts that make a dead letter.
var dlqVerdicts = []string{string(wire.VerdictInvalid), string(wire.VerdictStale), string(wire.VerdictConflict), string(wire.VerdictGap)}

// parseWhen reads a time: RFC 3339, or a duration ago ("90s", "15m").
func parseWhen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 || d > 100*365*24*time.Hour {
			return time.Time{}, fmt.Errorf("%q: give a positive duration", s)
		}
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither a time like 2026-01-02T15:04:05Z nor a duration like 15m", s)
	}
	return t, nil
}

// subject is the stream filter that narrows the read to the partition and
// task asked for.
func (q dlqQuery) subject(subj wire.Subjects) string {
	base := strings.TrimSuffix(subj.DLQAll(), ">")
	switch {
	case q.Partition >= 0 && q.Task != "":
		return subj.DLQ(q.Partition, q.Task)
	case q.Partition >= 0:
		return subj.DLQ(q.Partition, "*")
	case q.Task != "":
		return base + "*." + q.Task
	}
	return subj.DLQAll()
}

func (q dlqQuery) match(d DeadLetter) bool {
	switch {
	case q.Verdict != "" && d.Verdict != q.Verdict,
		q.Reason != "" && d.Reason != q.Reason,
		q.Holder != "" && d.Holder != q.Holder,
		q.Task != "" && d.Task != q.Task,
		q.Partition >= 0 && (d.Partition == nil || *d.Partition != q.Partition):
		return false
	}
	if !q.Since.IsZero() || !q.Until.IsZero() {
		at, err := time.Parse(time.RFC3339Nano, d.RejectedAt)
		if err != nil || (!q.Since.IsZero() && at.Before(q.Since)) || (!q.Until.IsZero() && at.After(q.Until)) {
			return false
		}
	}
	return true
}

// link is the list of q narrowed to one verdict and reason.
func (q dlqQuery) link(verdict, reason string) template.URL {
	v := url.Values{}
	for _, k := range dlqQueryFields {
		if q.Form[k] != "" {
			v.Set(k, q.Form[k])
		}
	}
	v.Set("verdict", verdict)
	v.Set("reason", reason)
	// url.Values encodes every value: the link is safe as it is.
	return template.URL("/dlq?" + v.Encode())
}

// dlqGroup counts the matching letters of one verdict and reason.
type dlqGroup struct {
	Verdict, Reason string
	Count           int
	Newest          uint64
	// Link lists the group's letters.
	Link template.URL
}

// dlqList is the dead-letter list view.
type dlqList struct {
	Query  dlqQuery
	Groups []dlqGroup
	// recent holds the newest matching letters, at most the show passed
	// to add, as a ring: once it is full, next is the oldest, the one the
	// next letter replaces. Letters lists them newest first.
	recent []DeadLetter
	next   int
	// Matched counts the matches; Read the letters read, from sequence
	// From on, of Stored in the stream.
	Matched, Read int
	From          uint64
	Stored        uint64
	// Last is the sequence up to which the stream was read.
	Last uint64
	// Cut says the read stopped before the stream's end (it took too long).
	Cut     bool
	Problem string
}

// scanTimeout bounds one read of the dead letters for a list.
const scanTimeout = 10 * time.Second

// scanDLQ reads the newest Config.DLQScan dead letters' headers and keeps
// those that match q.
func (s *Server) scanDLQ(ctx context.Context, q dlqQuery) (*dlqList, error) {
	l := &dlqList{Query: q}
	ctx, cancel := context.WithTimeout(ctx, scanTimeout)
	defer cancel()
	st, err := s.deps.JS.Stream(ctx, wire.StreamDLQ)
	if err != nil {
		return l, fmt.Errorf("open %s: %w", wire.StreamDLQ, err)
	}
	state := st.CachedInfo().State
	l.Stored = state.Msgs
	if state.Msgs == 0 {
		return l, nil
	}
	l.From = max(state.FirstSeq, state.LastSeq-min(state.LastSeq, uint64(s.cfg.DLQScan))+1)
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{q.subject(s.deps.Subjects)},
		HeadersOnly: true, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: l.From})
	if err != nil {
		return l, fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
	}
	if info := cons.CachedInfo(); info == nil || info.NumPending == 0 {
		l.Last = state.LastSeq
		return l, nil
	}
	it, err := cons.Messages()
	if err != nil {
		return l, fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				l.Cut = true
				return l, nil
			}
			return l, fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return l, fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
		}
		l.Read++
		l.Last = meta.Sequence.Stream
		l.add(s.deps.Ledger.DeadLetter(meta.Sequence.Stream, m.Subject(), m.Headers(), nil), s.cfg.DLQShow)
		if meta.NumPending == 0 {
			return l, nil
		}
	}
}

// add counts d if it matches, and keeps the newest show letters.
func (l *dlqList) add(d DeadLetter, show int) {
	if !l.Query.match(d) {
		return
	}
	l.Matched++
	i := slices.IndexFunc(l.Groups, func(g dlqGroup) bool { return g.Verdict == d.Verdict && g.Reason == d.Reason })
	if i < 0 {
		l.Groups = append(l.Groups, dlqGroup{Verdict: d.Verdict, Reason: d.Reason,
			Link: l.Query.link(d.Verdict, d.Reason)})
		i = len(l.Groups) - 1
	}
	l.Groups[i].Count++
	l.Groups[i].Newest = max(l.Groups[i].Newest, d.Seq)
	slices.SortFunc(l.Groups, func(a, b dlqGroup) int {
		return cmp.Or(b.Count-a.Count, strings.Compare(a.Verdict, b.Verdict), strings.Compare(a.Reason, b.Reason))
	})
	// A scan adds up to Config.DLQScan letters: each replaces the oldest
	// kept in place, rather than shifting every kept one along.
	switch {
	case show < 1:
		return
	case len(l.recent) < show:
		l.recent = append(l.recent, d)
	default:
		l.recent[l.next] = d
		l.next = (l.next + 1) % len(l.recent)
	}
}

// Letters are the newest matching letters, newest first.
func (l *dlqList) Letters() []DeadLetter {
	n := len(l.recent)
	out := make([]DeadLetter, n)
	for i := range out {
		out[i] = l.recent[(l.next-1-i+2*n)%n]
	}
	return out
}

// dlqView is a live dead-letter list: the letters read when it was opened,
// then each new one LEDGER_DLQ receives.
type dlqView struct {
	s      *Server
	q      dlqQuery
	sub    *dlqSub
	cancel func()
	mu     sync.Mutex
	list   *dlqList
	// seen is the newest sequence in list; a letter at or below it is one
	// the read already had.
	seen   uint64
	notify chan struct{}
	stop   chan struct{}
}

// dlqSource subscribes to new letters first and reads the stream second,
// so that no letter falls between the two.
func (s *Server) dlqSource(ctx context.Context, q dlqQuery) *dlqView {
	v := &dlqView{s: s, q: q, notify: make(chan struct{}, 1), stop: make(chan struct{})}
	v.sub, v.cancel = s.hub.subscribeDLQ()
	v.load(ctx)
	go v.follow(ctx)
	return v
}

func (v *dlqView) load(ctx context.Context) {
	list, err := v.s.scanDLQ(ctx, v.q)
	if err != nil {
		list.Problem = v.s.hub.problem("read "+wire.StreamDLQ, wire.StreamDLQ+" could not be read: has the ingest created it? (the console's log says why)", err)
	}
	v.mu.Lock()
	v.list, v.seen = list, list.Last
	v.mu.Unlock()
}

// follow adds the letters the hub hands over; a subscriber that fell
// behind reads the stream again.
func (v *dlqView) follow(ctx context.Context) {
	for {
		select {
		case d := <-v.sub.ch:
			v.mu.Lock()
			if d.Seq > v.seen {
				v.seen = d.Seq
				v.list.Read++
				v.list.Stored++
				v.list.From = cmp.Or(v.list.From, d.Seq)
				v.list.add(d, v.s.cfg.DLQShow)
			}
			v.mu.Unlock()
		case <-v.sub.lost:
			v.mu.Lock()
			v.cancel()
			v.sub, v.cancel = v.s.hub.subscribeDLQ()
			v.mu.Unlock()
			v.load(ctx)
		case <-ctx.Done():
			return
		case <-v.stop:
			return
		}
		select {
		case v.notify <- struct{}{}:
		default:
		}
	}
}

func (v *dlqView) data(context.Context) any {
	v.mu.Lock()
	defer v.mu.Unlock()
	c := *v.list
	c.Groups, c.recent = slices.Clone(c.Groups), slices.Clone(c.recent)
	return &c
}

func (v *dlqView) changed() <-chan struct{} { return v.notify }

func (v *dlqView) close() {
	close(v.stop)
	v.mu.Lock()
	v.cancel()
	v.mu.Unlock()
}

// letterView is one dead letter opened.
type letterView struct {
	Letter  DeadLetter
	Headers []headerRow
	// Body is the body as text, indented when it is JSON.
	Body string
	// Binary is set when the body is not UTF-8 text: Body then shows it
	// quoted.
	Binary bool
	Query  string
}

type headerRow struct {
	Name   string
	Values []string
}

func (s *Server) dlqPage(w http.ResponseWriter, r *http.Request) {
	q, err := parseDLQQuery(r.URL.Query())
	if err != nil {
		s.fail(w, http.StatusBadRequest, err.Error())
		return
	}
	list, err := s.scanDLQ(r.Context(), q)
	if err != nil {
		list.Problem = s.hub.problem("read "+wire.StreamDLQ, wire.StreamDLQ+" could not be read: has the ingest created it? (the console's log says why)", err)
	}
	s.livePage(w, r, "dlq", "Dead letters", "dlq", "dlq", list)
}

func parseSeq(s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a %s sequence", s, wire.StreamDLQ)
	}
	return n, nil
}
