package chaos

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/flowness/ledger/pkg/canonjson"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// ViolationKind names one of the promises the checker verifies.
type ViolationKind string

// The violations, in the order the report lists them. Each count must be 0.
const (
	// Lost: an event JetStream acked into LEDGER_IN has no verdict: no row
	// in ledger.events or ledger.rejections and no dead letter.
	Lost ViolationKind = "lost"
	// ReceiptedMissing: a writer received a receipt saying an event was
	// committed (with its seq), but ledger.events has no row of that event
	// at that seq: the database forgot an acknowledged commit.
	ReceiptedMissing ViolationKind = "receipted_missing"
	// StaleCommit: an event of generation g is committed although it was
	// first sent after a writer's grant of a later generation of its
	// partition had been acknowledged to that writer. On a partition in
	// the observe fence mode such a commit is expected, and must say
	// what enforce would have answered (would_reject); there, a stale
	// send committed without it is the violation, and on a partition in
	// enforce, a commit that says would_reject is one.
	StaleCommit ViolationKind = "stale_commits"
	// SupersededCommit: an old primary that came back writable after a
	// failover committed one of the run's events, or granted a lease of
	// one of its partitions (History.Superseded*).
	SupersededCommit ViolationKind = "superseded_commits"
	// GenerationTwice: one generation of a partition was granted to two
	// holders, by the writers' grants or by ledger.lease_grants: a fencing
	// token issued twice.
	GenerationTwice ViolationKind = "generations_twice"
	// NotDense: a task's committed versions are not exactly 1..n.
	NotDense ViolationKind = "not_dense"
	// MultiVerdict: an event id has more than one distinct final verdict:
	// committed and also rejected, or rejected in two different ways.
	MultiVerdict ViolationKind = "multi_verdict"
	// FaultGap: a gap verdict for a version whose predecessor the same
	// writer had published and had acked before sending it: a fault turned
	// into a verdict.
	FaultGap ViolationKind = "fault_gaps"
	// ProjectionDiffers: a task's ledger_tasks value is not the fold of its
	// committed events (or still reports a gap).
	ProjectionDiffers ViolationKind = "projections"
	// LogOutOfOrder: LEDGER_LOG stores a task's version before the one
	// preceding it, lacks committed versions, or holds a copy that is not
	// its row.
	LogOutOfOrder ViolationKind = "log_order"
	// Unknown: the ledger holds something of the run's tasks the checker
	// cannot account for: an event no writer sent, a dead letter whose
	// ledger headers do not read, or a grant a writer was given that is not
	// recorded as given to it.
	Unknown ViolationKind = "unknown"
	// SupersededEffect: the downstream applied a direct effect of a
	// partition after it had applied one of a higher generation: an
	// effect of a superseded holder.
	SupersededEffect ViolationKind = "superseded_effects"
	// IntentWithoutEffect: a committed effect intent has no effect applied
	// by the effect runner.
	IntentWithoutEffect ViolationKind = "intents_without_effect"
)

// Kinds lists every ViolationKind in report order.
var Kinds = []ViolationKind{Lost, ReceiptedMissing, StaleCommit, SupersededCommit, GenerationTwice, NotDense, MultiVerdict, FaultGap, ProjectionDiffers, LogOutOfOrder, Unknown,
	SupersededEffect, IntentWithoutEffect}

// rejectionVerdicts are the verdicts Report.Rejections counts, in the
// order the summary lists them.
var rejectionVerdicts = []wire.Verdict{wire.VerdictStale, wire.VerdictGap, wire.VerdictConflict, wire.VerdictInvalid}

// Violation is one broken promise.
type Violation struct {
	Kind ViolationKind
	// EventID is the offending event, if the violation is about one.
	EventID string
	// Task is the offending task.
	Task string
	// Detail says what is wrong.
	Detail string
}

// Report is what the checker found.
type Report struct {
	// Counts holds the number of violations of each kind.
	Counts map[ViolationKind]int
	// Violations are all of them, in report order.
	Violations []Violation
	// Events is how many distinct events the writers sent; Acked how many
	// of them JetStream acknowledged.
	Events, Acked int
	// Commits is the number of committed events.
	Commits int
	// Rejections counts rejected events (distinct ids) by verdict.
	Rejections map[string]int
	// Grants is the number of grants recorded for the run's partitions.
	Grants int
	// StaleSends is how many events were first sent after a later
	// generation's grant of their partition was acknowledged; the fence
	// must refuse every one (or, in observe, mark every one it lets
	// commit).
	StaleSends int
	// Observe is set when the run's partitions were in the observe fence
	// mode (History.Observing).
	Observe bool
	// WouldReject counts, by what enforce would have answered
	// ("stale/<reason>"), the committed events (distinct ids) whose row
	// says would_reject: in observe, what an enforce run counts in
	// Rejections["stale"].
	WouldReject map[string]int
	// WouldRejectStaleSends is how many stale sends committed under
	// observe, each marked would_reject.
	WouldRejectStaleSends int
	// ZombieSends is how many sends the writers made after noticing they
	// had been paused, with a generation they no longer trusted.
	ZombieSends int
	// ReceiptP50 and ReceiptP99 are percentiles of the time from an
	// event's first publish to its first receipt, over the events that got
	// one.
	ReceiptP50, ReceiptP99 time.Duration
	// DirectEffects counts the writers' direct effects by outcome
	// (applied, refused, error).
	DirectEffects map[string]int
	// Intents is how many effect intents were committed.
	Intents int
	// EffectsChecked is set when the downstream's effects were read and
	// checked (not against an external deployment).
	EffectsChecked bool
	// ForgottenGrants counts grants a writer was given that
	// ledger.lease_grants does not record, given while the database was
	// allowed to forget (History.Forgetful): an asynchronous failover
	// loses them with its tail. Their generations must still not be given
	// again (generations_twice).
	ForgottenGrants int
}

// Total is the number of violations.
func (r *Report) Total() int {
	n := 0
	for _, c := range r.Counts {
		n += c
	}
	return n
}

func (r *Report) add(v Violation) {
	r.Counts[v.Kind]++
	r.Violations = append(r.Violations, v)
}

// send is what the writer logs say about one event id.
type send struct {
	first  Record // its first pub
	writer *WriterLog
	ackT   int64 // first ack, 0 if none
	rcptT  int64 // first receipt, 0 if none
}

// grantAck is a grant as the writer that got it logged it.
type grantAck struct {
	gen    int64
	t      int64
	holder string
}

// checker holds the indexes of one check.
type checker struct {
	h     *History
	r     *Report
	sends map[string]*send
	// grants per partition, by acknowledgement time, with maxGen[i] the
	// highest generation among the first i+1.
	grants map[int][]grantAck
	maxGen map[int][]int64
	rows   map[string]*EventRow
}

// Check verifies the history and reports every violation. It reads only
// the history: the writers' own observations and the stored state.
func Check(h *History) *Report {
	c := &checker{h: h, r: &Report{Counts: map[ViolationKind]int{}, Rejections: map[string]int{}, DirectEffects: map[string]int{},
		WouldReject: map[string]int{}, Observe: len(h.Observing) > 0},
		sends: map[string]*send{}, grants: map[int][]grantAck{}, maxGen: map[int][]int64{}, rows: map[string]*EventRow{}}
	c.index()
	c.receiptLatency()
	c.lostAndVerdicts()
	c.receiptedMissing()
	c.staleCommits()
	c.superseded()
	c.generationsTwice()
	c.dense()
	c.faultGaps()
	c.projections()
	c.logOrder()
	c.unknown()
	c.effects()
	// One order whatever the map iteration did: by kind, then as found.
	sort.SliceStable(c.r.Violations, func(i, j int) bool {
		return slices.Index(Kinds, c.r.Violations[i].Kind) < slices.Index(Kinds, c.r.Violations[j].Kind)
	})
	return c.r
}

// receiptLatency sets the report's receipt percentiles.
func (c *checker) receiptLatency() {
	var d []int64
	for _, s := range c.sends {
		if s.rcptT != 0 {
			d = append(d, s.rcptT-s.first.T)
		}
	}
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return time.Duration(d[min(len(d)-1, int(q*float64(len(d))))]) }
	c.r.ReceiptP50, c.r.ReceiptP99 = at(0.50), at(0.99)
}

func (c *checker) index() {
	for _, w := range c.h.Writers {
		for _, rec := range w.Records {
			switch rec.Kind {
			case KindPub:
				s := c.sends[rec.ID]
				if s == nil {
					s = &send{first: rec, writer: w}
					c.sends[rec.ID] = s
					c.r.Events++
				}
				if rec.Zombie {
					c.r.ZombieSends++
				}
			case KindReceipt:
				if s := c.sends[rec.ID]; s != nil && s.rcptT == 0 {
					s.rcptT = rec.T
				}
			case KindAck:
				if s := c.sends[rec.ID]; s != nil && s.ackT == 0 {
					s.ackT = rec.T
					c.r.Acked++
				}
			case KindGrant:
				c.grants[w.Partition] = append(c.grants[w.Partition], grantAck{gen: rec.Gen, t: rec.T, holder: w.Holder})
			}
		}
	}
	for p, gs := range c.grants {
		sort.Slice(gs, func(i, j int) bool { return gs[i].t < gs[j].t })
		m := make([]int64, len(gs))
		for i, g := range gs {
			m[i] = g.gen
			if i > 0 {
				m[i] = max(m[i], m[i-1])
			}
		}
		c.maxGen[p] = m
	}
	for i := range c.h.Events {
		c.rows[c.h.Events[i].EventID] = &c.h.Events[i]
	}
	c.r.Commits = len(c.h.Events)
	c.r.Grants = len(c.h.Grants)
}

// supersededAt is the highest generation of partition p whose grant was
// acknowledged before t (0 if none).
func (c *checker) supersededAt(p int, t int64) int64 {
	gs := c.grants[p]
	i := sort.Search(len(gs), func(i int) bool { return gs[i].t >= t })
	if i == 0 {
		return 0
	}
	return c.maxGen[p][i-1]
}

// verdicts returns the distinct final verdicts recorded for every event id.
func (c *checker) verdicts() map[string][]string {
	out := map[string][]string{}
	add := func(id, v string) {
		if !slices.Contains(out[id], v) {
			out[id] = append(out[id], v)
		}
	}
	for _, e := range c.h.Events {
		add(e.EventID, string(wire.VerdictCommitted))
	}
	for _, r := range c.h.Rejections {
		add(r.EventID, r.Verdict+"/"+r.Reason)
	}
	for _, l := range c.h.DLQ {
		add(l.EventID, l.Verdict+"/"+l.Reason)
	}
	return out
}

func (c *checker) lostAndVerdicts() {
	verdicts := c.verdicts()
	rejected := map[string]map[string]bool{}
	for id, vs := range verdicts {
		for _, v := range vs {
			verdict, _, _ := strings.Cut(v, "/")
			if verdict == string(wire.VerdictCommitted) {
				continue
			}
			if rejected[verdict] == nil {
				rejected[verdict] = map[string]bool{}
			}
			rejected[verdict][id] = true
		}
		if len(vs) > 1 {
			c.r.add(Violation{Kind: MultiVerdict, EventID: id, Task: c.taskOf(id), Detail: "verdicts " + strings.Join(vs, ", ")})
		}
	}
	for _, v := range rejectionVerdicts {
		c.r.Rejections[string(v)] = len(rejected[string(v)])
	}
	for _, id := range c.sendOrder() {
		s := c.sends[id]
		if s.ackT != 0 && len(verdicts[id]) == 0 {
			c.r.add(Violation{Kind: Lost, EventID: id, Task: s.first.Task,
				Detail: fmt.Sprintf("acked (task %s version %d generation %d) but no row, rejection or dead letter", s.first.Task, s.first.Version, s.first.Gen)})
		}
	}
}

// sendOrder is the event ids in first-send order.
func (c *checker) sendOrder() []string {
	ids := make([]string, 0, len(c.sends))
	for id := range c.sends {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		a, b := c.sends[ids[i]].first, c.sends[ids[j]].first
		if a.T != b.T {
			return a.T < b.T
		}
		return ids[i] < ids[j]
	})
	return ids
}

func (c *checker) taskOf(id string) string {
	if s := c.sends[id]; s != nil {
		return s.first.Task
	}
	if r := c.rows[id]; r != nil {
		return r.Task
	}
	return ""
}

func (c *checker) staleCommits() {
	for _, id := range c.sendOrder() {
		s := c.sends[id]
		g := c.supersededAt(s.writer.Partition, s.first.T)
		if g <= s.first.Gen {
			continue
		}
		c.r.StaleSends++
		row := c.rows[id]
		switch {
		case row == nil:
		case c.h.Observing[row.Partition] && row.WouldReject != "":
			// The shadow fence let it through, and said what enforce would
			// have answered.
			c.r.WouldRejectStaleSends++
		case c.h.Observing[row.Partition]:
			c.r.add(Violation{Kind: StaleCommit, EventID: id, Task: row.Task,
				Detail: fmt.Sprintf("generation %d committed under observe (seq %d, version %d) without would_reject, though first sent after generation %d's grant was acknowledged",
					row.Generation, row.Seq, row.Version, g)})
		default:
			c.r.add(Violation{Kind: StaleCommit, EventID: id, Task: row.Task,
				Detail: fmt.Sprintf("generation %d committed (seq %d, version %d) though first sent after generation %d's grant was acknowledged",
					row.Generation, row.Seq, row.Version, g)})
		}
	}
	for _, e := range c.h.Events {
		if e.WouldReject == "" {
			continue
		}
		c.r.WouldReject[e.WouldReject]++
		if !c.h.Observing[e.Partition] {
			c.r.add(Violation{Kind: StaleCommit, EventID: e.EventID, Task: e.Task,
				Detail: fmt.Sprintf("committed (seq %d, version %d) with would_reject %s on partition %d, which enforces the fence",
					e.Seq, e.Version, e.WouldReject, e.Partition)})
		}
	}
}

func (c *checker) dense() {
	versions := map[string][]int64{}
	for _, e := range c.h.Events {
		versions[e.Task] = append(versions[e.Task], e.Version)
	}
	for _, task := range sortedKeys(versions) {
		vs := versions[task]
		slices.Sort(vs)
		for i, v := range vs {
			if v != int64(i+1) {
				c.r.add(Violation{Kind: NotDense, Task: task,
					Detail: fmt.Sprintf("committed versions are %s, not 1..%d", spans(vs), len(vs))})
				break
			}
		}
	}
}

func (c *checker) faultGaps() {
	// acked[{holder, task, version}] is the first time that writer had an
	// ack for that version of the task.
	type written struct {
		holder, task string
		version      int64
	}
	acked := map[written]int64{}
	for _, s := range c.sends {
		if s.ackT == 0 {
			continue
		}
		k := written{s.writer.Holder, s.first.Task, s.first.Version}
		if t, ok := acked[k]; !ok || s.ackT < t {
			acked[k] = s.ackT
		}
	}
	seen := map[string]bool{}
	check := func(id, verdict string) {
		if verdict != string(wire.VerdictGap) || seen[id] {
			return
		}
		seen[id] = true
		s := c.sends[id]
		if s == nil || s.first.Version < 2 {
			return
		}
		prev := written{s.writer.Holder, s.first.Task, s.first.Version - 1}
		if t, ok := acked[prev]; ok && t <= s.first.T {
			c.r.add(Violation{Kind: FaultGap, EventID: id, Task: s.first.Task,
				Detail: fmt.Sprintf("version %d judged gap though %s had version %d acked before sending it",
					s.first.Version, s.writer.Holder, s.first.Version-1)})
		}
	}
	for _, r := range c.h.Rejections {
		check(r.EventID, r.Verdict)
	}
	for _, l := range c.h.DLQ {
		check(l.EventID, l.Verdict)
	}
}

// storedProjection is the part of a ledger_tasks value the checker compares.
type storedProjection struct {
	Task         string          `json:"task"`
	Partition    int             `json:"partition"`
	Version      int64           `json:"version"`
	Status       string          `json:"status"`
	Data         json.RawMessage `json:"data"`
	Seq          int64           `json:"seq"`
	Gap          json.RawMessage `json:"gap"`
	DataTooLarge *int            `json:"data_too_large"`
}

// Fold is a task's projection as the contract defines it: its committed
// events folded in version order with the projection package's reducer.
func Fold(task string, events []EventRow) (projection.State, error) {
	evs := slices.Clone(events)
	sort.Slice(evs, func(i, j int) bool { return evs[i].Version < evs[j].Version })
	st := projection.State{Task: task}
	for _, e := range evs {
		next, err := projection.MergeReducer{}.Reduce(st, projection.Event{Task: e.Task, Partition: e.Partition,
			Version: e.Version, Seq: e.Seq, Type: e.Type, Payload: e.Payload})
		if err != nil {
			return st, fmt.Errorf("fold %s at version %d: %w", task, e.Version, err)
		}
		st = next
		st.Partition, st.Version, st.Seq = e.Partition, e.Version, e.Seq
	}
	return st, nil
}

func (c *checker) projections() {
	byTask := map[string][]EventRow{}
	for _, e := range c.h.Events {
		byTask[e.Task] = append(byTask[e.Task], e)
	}
	tasks := map[string]bool{}
	for _, w := range c.h.Writers {
		for _, t := range w.Tasks {
			tasks[t] = true
		}
	}
	for t := range byTask {
		tasks[t] = true
	}
	for _, task := range sortedKeys(tasks) {
		want, err := Fold(task, byTask[task])
		if err != nil {
			c.r.add(Violation{Kind: ProjectionDiffers, Task: task, Detail: err.Error()})
			continue
		}
		if d := projectionDiff(want, c.h.Projections[task]); d != "" {
			c.r.add(Violation{Kind: ProjectionDiffers, Task: task, Detail: d})
		}
	}
}

// projectionDiff says how a stored value differs from the fold; "" if not.
func projectionDiff(want projection.State, raw []byte) string {
	if raw == nil {
		if want.Version == 0 {
			return ""
		}
		return fmt.Sprintf("no value in the bucket; the log is at version %d", want.Version)
	}
	var got storedProjection
	if err := json.Unmarshal(raw, &got); err != nil {
		return fmt.Sprintf("value is not a projection: %v", err)
	}
	var diffs []string
	cmp := func(name string, w, g any) {
		if w != g {
			diffs = append(diffs, fmt.Sprintf("%s %v, want %v", name, g, w))
		}
	}
	cmp("task", want.Task, got.Task)
	cmp("version", want.Version, got.Version)
	cmp("seq", want.Seq, got.Seq)
	cmp("status", want.Status, got.Status)
	if want.Version > 0 {
		cmp("partition", want.Partition, got.Partition)
	}
	if got.DataTooLarge == nil && !jsonEqual(want.Data, got.Data) {
		diffs = append(diffs, fmt.Sprintf("data %s, want %s", orNull(got.Data), orNull(want.Data)))
	}
	if g := strings.TrimSpace(string(got.Gap)); g != "" && g != "null" {
		diffs = append(diffs, "gap "+g+", want null")
	}
	return strings.Join(diffs, "; ")
}

func orNull(b []byte) string {
	if len(b) == 0 {
		return "null"
	}
	return string(b)
}

// jsonEqual compares two JSON texts as values, by the ledger's one rule of
// JSON equality (pkg/canonjson); empty is null.
func jsonEqual(a, b []byte) bool {
	eq, err := canonjson.Equal([]byte(orNull(a)), []byte(orNull(b)))
	return err == nil && eq
}

func (c *checker) logOrder() {
	top := map[string]int64{}
	for _, cp := range c.h.Log {
		row := c.rows[cp.EventID]
		switch {
		case cp.Err != "":
			c.r.add(Violation{Kind: LogOutOfOrder, EventID: cp.EventID, Task: cp.Task,
				Detail: fmt.Sprintf("copy at stream seq %d is %s", cp.StreamSeq, cp.Err)})
			continue
		case row == nil:
			c.r.add(Violation{Kind: LogOutOfOrder, EventID: cp.EventID, Task: cp.Task,
				Detail: fmt.Sprintf("copy at stream seq %d is of an event ledger.events does not hold", cp.StreamSeq)})
			continue
		case row.Task != cp.Task || row.Version != cp.Version || row.Seq != cp.Seq || row.Partition != cp.Partition ||
			row.Type != cp.Type || row.Holder != cp.Holder || row.Generation != cp.Generation:
			c.r.add(Violation{Kind: LogOutOfOrder, EventID: cp.EventID, Task: cp.Task,
				Detail: fmt.Sprintf("copy at stream seq %d says %s v%d seq %d, the row %s v%d seq %d",
					cp.StreamSeq, cp.Task, cp.Version, cp.Seq, row.Task, row.Version, row.Seq)})
			continue
		case cp.WouldReject != "" && cp.WouldReject != row.WouldReject:
			// A re-published duplicate's copy may leave it out; none may
			// say what its row does not.
			c.r.add(Violation{Kind: LogOutOfOrder, EventID: cp.EventID, Task: cp.Task,
				Detail: fmt.Sprintf("copy at stream seq %d says would_reject %q, the row %q", cp.StreamSeq, cp.WouldReject, row.WouldReject)})
		}
		last := top[cp.Task]
		switch {
		case cp.Version <= last: // a repeat of a stored version: readers skip it
		case cp.Version == last+1:
			top[cp.Task] = cp.Version
		default:
			c.r.add(Violation{Kind: LogOutOfOrder, EventID: cp.EventID, Task: cp.Task,
				Detail: fmt.Sprintf("version %d stored at stream seq %d before version %d", cp.Version, cp.StreamSeq, last+1)})
			top[cp.Task] = cp.Version
		}
	}
	head := map[string]int64{}
	for _, e := range c.h.Events {
		head[e.Task] = max(head[e.Task], e.Version)
	}
	for _, task := range sortedKeys(head) {
		if top[task] < head[task] {
			c.r.add(Violation{Kind: LogOutOfOrder, Task: task,
				Detail: fmt.Sprintf("LEDGER_LOG ends at version %d; ledger.events at %d", top[task], head[task])})
		}
	}
}

func (c *checker) unknown() {
	seen := map[string]bool{}
	flag := func(id, task, where string) {
		if c.sends[id] != nil || seen[id] {
			return
		}
		seen[id] = true
		c.r.add(Violation{Kind: Unknown, EventID: id, Task: task, Detail: "in " + where + ", but no writer sent it"})
	}
	for _, e := range c.h.Events {
		flag(e.EventID, e.Task, "ledger.events")
	}
	for _, r := range c.h.Rejections {
		flag(r.EventID, r.Task, "ledger.rejections")
	}
	for _, l := range c.h.DLQ {
		flag(l.EventID, l.Task, "LEDGER_DLQ")
		if l.Err != "" {
			c.r.add(Violation{Kind: Unknown, EventID: l.EventID, Task: l.Task,
				Detail: fmt.Sprintf("dead letter at stream seq %d does not read: %s", l.StreamSeq, l.Err)})
		}
	}
	type grant struct {
		partition  int
		generation int64
	}
	recorded := map[grant]string{}
	for _, g := range c.h.Grants {
		recorded[grant{g.Partition, g.Generation}] = g.Holder
	}
	for _, p := range sortedKeys(c.grants) {
		for _, g := range c.grants[p] {
			h, ok := recorded[grant{p, g.gen}]
			switch {
			case ok: // another holder is generations_twice
			case c.forgetful(g.t):
				c.r.ForgottenGrants++
			default:
				c.r.add(Violation{Kind: Unknown, Detail: fmt.Sprintf("%s was granted partition %d generation %d, but ledger.lease_grants records %q",
					g.holder, p, g.gen, h)})
			}
		}
	}
}

// forgetful reports whether t (Unix ns) is in a window in which the
// database was allowed to forget.
func (c *checker) forgetful(t int64) bool {
	for _, w := range c.h.Forgetful {
		if t >= w[0] && t <= w[1] {
			return true
		}
	}
	return false
}

// receiptedMissing finds committed receipts whose event the database does
// not hold at the receipt's seq.
func (c *checker) receiptedMissing() {
	seen := map[string]bool{}
	for _, w := range c.h.Writers {
		for _, rec := range w.Records {
			if rec.Kind != KindReceipt || rec.Verdict != string(wire.VerdictCommitted) || seen[rec.ID] {
				continue
			}
			seen[rec.ID] = true
			row := c.rows[rec.ID]
			switch {
			case row == nil:
				c.r.add(Violation{Kind: ReceiptedMissing, EventID: rec.ID, Task: rec.Task,
					Detail: fmt.Sprintf("receipt said committed at seq %d (version %d); ledger.events has no such event", rec.Seq, rec.Version)})
			case rec.Seq != 0 && uint64(row.Seq) != rec.Seq:
				c.r.add(Violation{Kind: ReceiptedMissing, EventID: rec.ID, Task: rec.Task,
					Detail: fmt.Sprintf("receipt said committed at seq %d; ledger.events holds it at seq %d", rec.Seq, row.Seq)})
			}
		}
	}
}

// superseded counts what an old primary committed or granted after it
// came back writable.
func (c *checker) superseded() {
	for _, e := range c.h.SupersededEvents {
		c.r.add(Violation{Kind: SupersededCommit, EventID: e.EventID, Task: e.Task,
			Detail: fmt.Sprintf("committed on a superseded primary: version %d generation %d seq %d", e.Version, e.Generation, e.Seq)})
	}
	for _, g := range c.h.SupersededGrants {
		c.r.add(Violation{Kind: SupersededCommit,
			Detail: fmt.Sprintf("a superseded primary granted partition %d generation %d to %s", g.Partition, g.Generation, g.Holder)})
	}
}

// generationsTwice finds a generation of a partition given to two holders:
// in the writers' grants, or a writer's grant that ledger.lease_grants
// records for another holder.
func (c *checker) generationsTwice() {
	type key struct {
		partition int
		gen       int64
	}
	holders := map[key][]string{}
	add := func(k key, h string) {
		if !slices.Contains(holders[k], h) {
			holders[k] = append(holders[k], h)
		}
	}
	for _, p := range sortedKeys(c.grants) {
		for _, g := range c.grants[p] {
			add(key{p, g.gen}, g.holder)
		}
	}
	for _, g := range c.h.Grants {
		if _, ok := holders[key{g.Partition, g.Generation}]; ok {
			add(key{g.Partition, g.Generation}, g.Holder)
		}
	}
	keys := make([]key, 0, len(holders))
	for k := range holders {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].partition < keys[j].partition || keys[i].partition == keys[j].partition && keys[i].gen < keys[j].gen
	})
	for _, k := range keys {
		if hs := holders[k]; len(hs) > 1 {
			c.r.add(Violation{Kind: GenerationTwice,
				Detail: fmt.Sprintf("partition %d generation %d was granted to %s", k.partition, k.gen, strings.Join(hs, " and "))})
		}
	}
}

// spans renders sorted versions compactly: "1-4,6,8-9".
func spans(vs []int64) string {
	var b strings.Builder
	for i := 0; i < len(vs); {
		j := i
		for j+1 < len(vs) && vs[j+1] == vs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", vs[i], vs[j])
		} else {
			fmt.Fprintf(&b, "%d", vs[i])
		}
		i = j + 1
	}
	return b.String()
}

func sortedKeys[K string | int, V any](m map[K]V) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
