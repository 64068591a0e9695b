package chaos

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Fault kinds, as the summary names them.
const (
	FaultSigstop     = "sigstop"
	FaultKillIngest  = "kill_ingest"
	FaultNATSRestart = "nats_restart"
	FaultNATSKill    = "nats_kill"
	FaultPGRestart   = "pg_restart"
	FaultPGCut       = "pg_cut"
	FaultPGFailover  = "pg_failover"
	FaultNATSLoss    = "nats_storage_loss"
)

// FaultCount is how often one kind of fault was injected.
type FaultCount struct {
	Kind  string
	Count int
}

// SummaryLine is the one line a run ends with, like
//
//	chaos: 60s events=9120 commits=8890 rejections={stale:230 gap:0 conflict:0 invalid:0} grants=41 stale_sends=230 faults={sigstop:14 kill_ingest:6 nats_restart:2 pg_restart:2} exits=0 violations=0
//
// exits counts service processes that exited without being killed by a
// fault (each was restarted).
func SummaryLine(d time.Duration, r *Report, faults []FaultCount, exits int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos: %s ", d.Round(time.Second))
	writeCounts(&b, r)
	b.WriteString(" faults={")
	for i, f := range faults {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%d", f.Kind, f.Count)
	}
	fmt.Fprintf(&b, "} exits=%d violations=%d", exits, r.Total())
	return b.String()
}

// CheckLine is the summary of a check without a run ("ledgerlab chaos
// check"): the counts of SummaryLine without duration, faults and exits.
func CheckLine(r *Report) string {
	var b strings.Builder
	b.WriteString("chaos check: ")
	writeCounts(&b, r)
	fmt.Fprintf(&b, " violations=%d", r.Total())
	return b.String()
}

func writeCounts(b *strings.Builder, r *Report) {
	fmt.Fprintf(b, "events=%d commits=%d rejections={", r.Events, r.Commits)
	for i, v := range rejectionVerdicts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(b, "%s:%d", v, r.Rejections[string(v)])
	}
	b.WriteByte('}')
	if r.Observe {
		// Where an enforce run counts its stale refusals: the commits the
		// shadow fence let through.
		fmt.Fprintf(b, " would_reject={")
		for i, k := range sortedKeys(r.WouldReject) {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(b, "%s:%d", k, r.WouldReject[k])
		}
		fmt.Fprintf(b, "} would_reject_stale_sends=%d", r.WouldRejectStaleSends)
	}
	fmt.Fprintf(b, " grants=%d stale_sends=%d receipt_p50=%s receipt_p99=%s", r.Grants, r.StaleSends,
		r.ReceiptP50.Round(time.Millisecond), r.ReceiptP99.Round(time.Millisecond))
	if r.ForgottenGrants > 0 {
		fmt.Fprintf(b, " forgotten_grants=%d", r.ForgottenGrants)
	}
	if r.EffectsChecked {
		fmt.Fprintf(b, " intents=%d direct_effects={applied:%d refused:%d error:%d}", r.Intents,
			r.DirectEffects["applied"], r.DirectEffects["refused"], r.DirectEffects["error"])
	}
}

// PrintViolations writes the count of every kind and, for the first show
// violations of each kind, the offender's history: what its writer logged,
// its rows, its dead letters and its log copies.
func PrintViolations(w io.Writer, h *History, r *Report, show int) {
	if r.Total() == 0 {
		fmt.Fprintln(w, "chaos: no violations:", countsLine(r))
		return
	}
	fmt.Fprintln(w, "chaos: VIOLATIONS:", countsLine(r))
	x := newHistoryIndex(h)
	for _, k := range Kinds {
		n := 0
		for _, v := range r.Violations {
			if v.Kind != k {
				continue
			}
			if n == show {
				fmt.Fprintf(w, "  ... and %d more %s\n", r.Counts[k]-show, k)
				break
			}
			n++
			fmt.Fprintf(w, "\n%s: ", k)
			if v.EventID != "" {
				fmt.Fprintf(w, "event %s ", v.EventID)
			}
			if v.Task != "" {
				fmt.Fprintf(w, "task %s ", v.Task)
			}
			fmt.Fprintln(w, "—", v.Detail)
			for _, line := range x.story(v) {
				fmt.Fprintln(w, "   ", line)
			}
		}
	}
}

func countsLine(r *Report) string {
	parts := make([]string, 0, len(Kinds))
	for _, k := range Kinds {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.Counts[k]))
	}
	return strings.Join(parts, " ")
}

// historyIndex finds everything the history holds about an event or task.
type historyIndex struct {
	h      *History
	byID   map[string][]string // writer log lines per event id
	sendOf map[string]Record
	holder map[string]string // event id -> writer
}

func newHistoryIndex(h *History) *historyIndex {
	x := &historyIndex{h: h, byID: map[string][]string{}, sendOf: map[string]Record{}, holder: map[string]string{}}
	for _, w := range h.Writers {
		for _, rec := range w.Records {
			if rec.ID == "" {
				continue
			}
			x.byID[rec.ID] = append(x.byID[rec.ID], fmt.Sprintf("%s %s %s", stamp(rec.T), w.Holder, describe(rec)))
			if rec.Kind == KindPub {
				if _, ok := x.sendOf[rec.ID]; !ok {
					x.sendOf[rec.ID], x.holder[rec.ID] = rec, w.Holder
				}
			}
		}
	}
	return x
}

// story is the lines that tell a violation's history.
func (x *historyIndex) story(v Violation) []string {
	var out []string
	if v.EventID != "" {
		out = append(out, x.eventStory(v.EventID)...)
		if v.Kind == StaleCommit {
			out = append(out, x.supersedingGrant(v.EventID)...)
		}
		return out
	}
	if v.Task != "" {
		return x.taskStory(v.Task)
	}
	return nil
}

func (x *historyIndex) eventStory(id string) []string {
	out := slices.Clone(x.byID[id])
	for _, e := range x.h.Events {
		if e.EventID == id {
			out = append(out, fmt.Sprintf("%s ledger.events seq %d %s v%d %s holder %s gen %d payload %s",
				stamp(e.CommittedAt.UnixNano()), e.Seq, e.Task, e.Version, e.Type, e.Holder, e.Generation, e.Payload))
		}
	}
	for _, r := range x.h.Rejections {
		if r.EventID == id {
			out = append(out, fmt.Sprintf("%s ledger.rejections %s/%s %s v%d holder %s gen %d (current gen %d)",
				stamp(r.RejectedAt.UnixNano()), r.Verdict, r.Reason, r.Task, r.Version, r.Holder, r.Generation, r.CurrentGeneration))
		}
	}
	for _, l := range x.h.DLQ {
		if l.EventID == id {
			out = append(out, fmt.Sprintf("LEDGER_DLQ #%d %s %s/%s v%d holder %s gen %d", l.StreamSeq, l.Subject, l.Verdict, l.Reason,
				l.Version, l.Holder, l.Generation))
		}
	}
	for _, c := range x.h.Log {
		if c.EventID == id {
			out = append(out, fmt.Sprintf("LEDGER_LOG #%d %s v%d seq %d gen %d", c.StreamSeq, c.Subject, c.Version, c.Seq, c.Generation))
		}
	}
	if len(out) == 0 {
		out = append(out, "(nothing recorded anywhere)")
	}
	return out
}

// supersedingGrant is the first grant of a later generation acknowledged
// before the event was first sent.
func (x *historyIndex) supersedingGrant(id string) []string {
	send, ok := x.sendOf[id]
	if !ok {
		return nil
	}
	var part int
	for _, w := range x.h.Writers {
		if w.Holder == x.holder[id] {
			part = w.Partition
		}
	}
	for _, w := range x.h.Writers {
		if w.Partition != part {
			continue
		}
		for _, rec := range w.Records {
			if rec.Kind == KindGrant && rec.Gen > send.Gen && rec.T < send.T {
				return []string{fmt.Sprintf("%s %s grant of generation %d acknowledged (%s before the first send)",
					stamp(rec.T), w.Holder, rec.Gen, time.Duration(send.T-rec.T).Round(time.Millisecond))}
			}
		}
	}
	return nil
}

func (x *historyIndex) taskStory(task string) []string {
	var vs []int64
	for _, e := range x.h.Events {
		if e.Task == task {
			vs = append(vs, e.Version)
		}
	}
	slices.Sort(vs)
	out := []string{fmt.Sprintf("ledger.events: versions %s", spans(vs))}
	var copies []string
	for _, c := range x.h.Log {
		if c.Task == task {
			copies = append(copies, fmt.Sprintf("v%d", c.Version))
		}
	}
	if len(copies) > 40 {
		copies = append(copies[:20], append([]string{"..."}, copies[len(copies)-20:]...)...)
	}
	out = append(out, "LEDGER_LOG copies in stream order: "+strings.Join(copies, " "))
	if v, ok := x.h.Projections[task]; ok {
		out = append(out, "ledger_tasks: "+string(v))
	} else {
		out = append(out, "ledger_tasks: no value")
	}
	return out
}

func describe(r Record) string {
	switch r.Kind {
	case KindPub:
		z := ""
		if r.Zombie {
			z = " ZOMBIE"
		}
		return fmt.Sprintf("pub %s v%d gen %d try %d%s", r.Task, r.Version, r.Gen, r.Try, z)
	case KindAck:
		return fmt.Sprintf("ack LEDGER_IN seq %d dup=%v", r.Seq, r.Dup)
	case KindNack:
		return "no ack: " + r.Err
	case KindReceipt:
		if r.Reason == "" {
			return fmt.Sprintf("receipt %s seq %d", r.Verdict, r.Seq)
		}
		return fmt.Sprintf("receipt %s/%s seq %d", r.Verdict, r.Reason, r.Seq)
	case KindEffect:
		z := ""
		if r.Zombie {
			z = " ZOMBIE"
		}
		return fmt.Sprintf("direct effect gen %d%s", r.Gen, z)
	case KindEffectDone:
		return "direct effect " + r.Verdict + " " + r.Err
	}
	return r.Kind
}

func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format("15:04:05.000") }
