package ctl

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/flowness/ledger/pkg/wire"
)

// ReplayWaitDefault is how long dlq replay waits for the new verdicts (the
// receipts of the re-submitted events): 5 s.
const ReplayWaitDefault = 5 * time.Second

// Outcomes of one dead letter in dlq replay.
const (
	replaySubmitted    = "submitted"
	replayDeduplicated = "deduplicated"
	replayUnusable     = "not_replayable"
	replayNotFound     = "not_found"
	replayFailed       = "failed"
	replayDryRun       = "dry_run"
)

// replayResult is what became of one dead letter.
type replayResult struct {
	StreamSeq uint64 `json:"stream_seq"`
	EventID   string `json:"event_id"`
	// NewEventID is the fresh id given with -new-id.
	NewEventID string `json:"new_event_id,omitempty"`
	// Subject is the LEDGER_IN subject it was (or would be) published to.
	Subject string `json:"subject,omitempty"`
	Result  string `json:"result"`
	// InSeq is the sequence of the re-submitted message in LEDGER_IN.
	InSeq uint64 `json:"in_seq,omitempty"`
	// Verdict and Reason are the new verdict, from the holder's receipt.
	Verdict string `json:"verdict,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Detail  string `json:"detail,omitempty"`

	holder string
}

// submittedID is the event id the ledger sees for the re-submitted message.
func (r *replayResult) submittedID() string {
	if r.NewEventID != "" {
		return r.NewEventID
	}
	return r.EventID
}

// DLQReplay re-publishes dead letters to LEDGER_IN so that the ingest gives
// them a fresh verdict ("dlq replay").
func DLQReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl dlq replay", "-seq N[,N...] | -id ID[,ID...] | [-verdict V] [-reason R] [-task T] [-partition N] -all  [-new-id] [-wait D] [-dry-run]",
		`Re-submit dead letters to LEDGER_IN (<prefix>.in.<partition>.<task>) for a fresh verdict:
the original body and headers, without the Ledger-Verdict, -Reason, -Current-*,
-Rejected-At and -Source-Seq headers the DLQ added (and without Nats-Expected-*
publish preconditions). Nothing else is changed: a stale event stays stale, since its
generation is kept. Choose dead letters by DLQ stream sequence (-seq), or by filters
with -all. The dead letters stay in LEDGER_DLQ.

LEDGER_IN drops a message whose Nats-Msg-Id it saw within its duplicate window
(2 min): replaying sooner after the original publish is reported as deduplicated.
-new-id publishes under a fresh event id instead, making a new event with the same
content (for a gap whose missing versions have arrived since, say); the ledger's
duplicate check by (task, version) and content still prevents a double commit.
Dead letters of <prefix>.dlq.invalid (unusable subject) cannot be replayed.`, stderr)
	var df dlqFilter
	df.register(f)
	var seqs seqList
	f.Var(&seqs, "seq", "replay the dead letter with this LEDGER_DLQ sequence (repeatable, or comma separated)")
	all := f.Bool("all", false, "replay every dead letter that matches the filters (required without -seq)")
	newID := f.Bool("new-id", false, "publish under a fresh event id (ULID) instead of the original Nats-Msg-Id")
	wait := f.Duration("wait", ReplayWaitDefault, "how long to wait for the new verdicts (0: do not wait)")
	dryRun := f.Bool("dry-run", false, "show what would be re-submitted, publish nothing")
	limit := f.Int("limit", 0, "replay at most this many of the matching dead letters (0: all)")
	if err := f.Parse(args); err != nil {
		return err
	}
	switch {
	case f.NArg() > 0:
		return Usagef("unexpected argument %q", f.Arg(0))
	case len(seqs) > 0 && (*all || df.set()):
		return Usagef("choose dead letters either with -seq or with filters and -all, not both")
	case len(seqs) == 0 && !*all && df.set() && !df.byIDOnly():
		return Usagef("replaying by filter re-submits every match: add -all to confirm (or pick them with -seq or -id)")
	case len(seqs) == 0 && !*all && !df.byIDOnly():
		return Usagef("choose the dead letters: -seq N[,N...], -id ID[,ID...], or filters and -all")
	case *wait < 0 || *limit < 0:
		return Usagef("-wait and -limit must not be negative")
	}
	if err := df.validate(); err != nil {
		return err
	}

	nc, js, err := f.JetStream()
	if err != nil {
		return err
	}
	defer nc.Close()
	subj := f.Subjects()

	letters, results, err := chooseDeadLetters(ctx, js, subj, seqs, &df, *limit)
	if err != nil {
		return err
	}
	in, err := stream(ctx, js, inboxes(ctx, js, f.Prefix)[0]) // every inbox has LEDGER_IN's window
	if err != nil {
		return err
	}
	window := in.CachedInfo().Config.Duplicates

	var receipts chan *nats.Msg
	if !*dryRun && *wait > 0 {
		if receipts, err = subscribeReceipts(nc, subj, letters); err != nil {
			return err
		}
	}
	for _, d := range letters {
		results = append(results, replayOne(ctx, js, subj, d, *newID, *dryRun))
	}
	slices.SortFunc(results, func(a, b replayResult) int { return cmp.Compare(a.StreamSeq, b.StreamSeq) })
	if receipts != nil {
		awaitVerdicts(ctx, receipts, results, *wait)
	}

	if err := printReplay(stdout, f.JSON, results, *wait); err != nil {
		return err
	}
	return replaySummary(stderr, results, window)
}

// chooseDeadLetters reads the dead letters to replay: by sequence (a
// missing one becomes a not_found result), or every match of the filter.
func chooseDeadLetters(ctx context.Context, js jetstream.JetStream, subj wire.Subjects, seqs seqList,
	df *dlqFilter, limit int) ([]deadLetter, []replayResult, error) {
	var letters []deadLetter
	if len(seqs) == 0 {
		_, err := scanDLQ(ctx, js, subj, df, limit, func(d deadLetter) error {
			letters = append(letters, d)
			return nil
		})
		return letters, nil, err
	}
	s, err := stream(ctx, js, wire.StreamDLQ)
	if err != nil {
		return nil, nil, err
	}
	var results []replayResult
	slices.Sort(seqs)
	for _, seq := range slices.Compact(seqs) {
		gctx, cancel := context.WithTimeout(ctx, RequestTimeout)
		m, err := s.GetMsg(gctx, seq)
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			results = append(results, replayResult{StreamSeq: seq, Result: replayNotFound,
				Detail: fmt.Sprintf("%s has no message %d (deleted, purged or never stored)", wire.StreamDLQ, seq)})
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read %s message %d: %w", wire.StreamDLQ, seq, err)
		}
		letters = append(letters, newDeadLetter(subj, m.Sequence, m.Subject, m.Header, m.Data))
	}
	return letters, results, nil
}

// subscribeReceipts listens to the receipts of the dead letters' holders,
// before anything is published, so that no verdict is missed.
func subscribeReceipts(nc *nats.Conn, subj wire.Subjects, letters []deadLetter) (chan *nats.Msg, error) {
	ch := make(chan *nats.Msg, 4096)
	seen := map[string]bool{}
	for _, d := range letters {
		if !wire.ValidHolder(d.Holder) || seen[d.Holder] {
			continue
		}
		seen[d.Holder] = true
		if _, err := nc.ChanSubscribe(subj.Receipt(d.Holder), ch); err != nil {
			return nil, fmt.Errorf("subscribe to receipts of %s: %w", d.Holder, err)
		}
	}
	if err := nc.FlushTimeout(RequestTimeout); err != nil {
		return nil, fmt.Errorf("subscribe to receipts: %w", err)
	}
	return ch, nil
}

// strippedHeader reports whether a dead letter's header is left out of the
// replay: what the DLQ added, one-shot publish preconditions, and the
// headers a direct get adds.
func strippedHeader(name string) bool {
	for _, h := range append(wire.DeadLetterHeaders[:len(wire.DeadLetterHeaders):len(wire.DeadLetterHeaders)],
		"Nats-Stream", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Subject", "Nats-Last-Sequence", "Nats-Num-Pending") {
		if strings.EqualFold(name, h) {
			return true
		}
	}
	p := wire.HeaderExpectedPrefix
	return len(name) >= len(p) && strings.EqualFold(name[:len(p)], p)
}

// replayMsg is the LEDGER_IN message that re-submits d.
func replayMsg(d deadLetter, subj wire.Subjects) *nats.Msg {
	m := nats.NewMsg(subj.In(d.Holder, *d.Partition, d.Task))
	for k, vs := range d.header {
		if strippedHeader(k) {
			continue
		}
		for _, v := range vs {
			m.Header.Add(k, v)
		}
	}
	m.Data = d.data
	return m
}

func replayOne(ctx context.Context, js jetstream.JetStream, subj wire.Subjects, d deadLetter, newID, dryRun bool) replayResult {
	r := replayResult{StreamSeq: d.StreamSeq, EventID: d.EventID, holder: d.Holder}
	if d.unusable != "" {
		r.Result, r.Detail = replayUnusable, "cannot be replayed: "+d.unusable
		return r
	}
	m := replayMsg(d, subj)
	r.Subject = m.Subject
	if newID {
		r.NewEventID = ulid.Make().String()
		m.Header.Set(wire.HeaderMsgID, wire.MsgID(r.NewEventID, ""))
	}
	if dryRun {
		r.Result = replayDryRun
		return r
	}
	pctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	// Not jetstream.WithExpectStream: its header would be stored with the
	// message and copied into a dead letter by the ingest, whose publish to
	// LEDGER_DLQ would then fail. The ack names the stream instead.
	ack, err := js.PublishMsg(pctx, m)
	switch {
	case err != nil:
		r.Result, r.Detail = replayFailed, fmt.Sprintf("publish to %s: %v", m.Subject, err)
	case !isInbox(ack.Stream):
		r.Result, r.Detail = replayFailed, fmt.Sprintf("%s is stored by stream %s, not an inbox (%s or %s<principal>)",
			m.Subject, ack.Stream, wire.StreamIn, wire.StreamInboxPrefix)
	case ack.Duplicate:
		r.Result = replayDeduplicated
		r.Detail = fmt.Sprintf("%s already had Nats-Msg-Id %s within its duplicate window and dropped this copy", ack.Stream, r.submittedID())
	default:
		r.Result, r.InSeq = replaySubmitted, ack.Sequence
	}
	return r
}

// awaitVerdicts fills in the verdicts of the submitted events from their
// receipts, until all have one or wait has passed.
func awaitVerdicts(ctx context.Context, receipts chan *nats.Msg, results []replayResult, wait time.Duration) {
	waiting := map[string]int{}
	for i, r := range results {
		if r.Result == replaySubmitted && wire.ValidHolder(r.holder) {
			if _, dup := waiting[r.submittedID()]; !dup {
				waiting[r.submittedID()] = i
			}
		}
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for len(waiting) > 0 {
		select {
		case m := <-receipts:
			var rc wire.Receipt
			if json.Unmarshal(m.Data, &rc) != nil {
				continue
			}
			if i, ok := waiting[rc.EventID]; ok {
				results[i].Verdict, results[i].Reason = string(rc.Verdict), rc.Reason
				delete(waiting, rc.EventID)
			}
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

func printReplay(w io.Writer, asJSON bool, results []replayResult, wait time.Duration) error {
	if asJSON {
		return writeJSONLines(w, results)
	}
	if len(results) == 0 {
		fmt.Fprintln(w, "no dead letters match")
		return nil
	}
	t := newTable(w, "SEQ", "EVENT ID", "SUBMITTED AS", "TO", "RESULT", "NEW VERDICT")
	for _, r := range results {
		res := r.Result
		if r.Result == replaySubmitted {
			res = fmt.Sprintf("submitted (%s seq %d)", wire.StreamIn, r.InSeq)
		}
		verdict := "-"
		switch {
		case r.Verdict != "" && r.Reason != "":
			verdict = r.Verdict + "/" + r.Reason
		case r.Verdict != "":
			verdict = r.Verdict
		case r.Result == replaySubmitted && wait > 0:
			verdict = "no receipt within " + wait.String()
		}
		as := "(same id)"
		if r.NewEventID != "" {
			as = r.NewEventID
		}
		t.row(r.StreamSeq, orDash(r.EventID), as, orDash(r.Subject), res, verdict)
	}
	return t.flush()
}

// replaySummary explains, once per kind, why dead letters were not
// re-submitted, and fails if any was not.
func replaySummary(w io.Writer, results []replayResult, window time.Duration) error {
	byKind := map[string][]replayResult{}
	for _, r := range results {
		byKind[r.Result] = append(byKind[r.Result], r)
	}
	for _, r := range byKind[replayNotFound] {
		fmt.Fprintf(w, "seq %d: not found: %s\n", r.StreamSeq, printable(r.Detail))
	}
	for _, r := range byKind[replayUnusable] {
		fmt.Fprintf(w, "seq %d: %s\n", r.StreamSeq, printable(r.Detail))
	}
	for _, r := range byKind[replayFailed] {
		fmt.Fprintf(w, "seq %d: failed: %s\n", r.StreamSeq, printable(r.Detail))
	}
	if dups := byKind[replayDeduplicated]; len(dups) > 0 {
		seqs := make([]string, len(dups))
		for i, r := range dups {
			seqs[i] = fmt.Sprint(r.StreamSeq)
		}
		fmt.Fprintf(w, "seq %s: deduplicated by %s's duplicate window (%v): the stream saw the same "+
			"Nats-Msg-Id less than %v ago and dropped the copy, so no new verdict will come. "+
			"Retry after the window has passed since the event was last published, or replay with "+
			"-new-id to submit the same content under a fresh event id.\n",
			strings.Join(seqs, ","), wire.StreamIn, window, window)
	}
	failed := len(results) - len(byKind[replaySubmitted]) - len(byKind[replayDryRun])
	if failed > 0 {
		return fmt.Errorf("%d of %d dead letters were not re-submitted", failed, len(results))
	}
	return nil
}
