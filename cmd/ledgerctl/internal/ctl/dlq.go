package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
)

var dlqCommands = map[string]Command{
	"list":   {DLQList, "[filters] [-limit N]", "list dead letters (reads LEDGER_DLQ, consumes nothing)"},
	"replay": {DLQReplay, "-seq N[,N...] | -id ID[,ID...] | [filters] -all  [-new-id] [-wait D] [-dry-run]", "re-submit dead letters to LEDGER_IN for a fresh verdict"},
}

// DLQ dispatches the "dlq" subcommands.
func DLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "ledgerctl dlq", dlqCommands, args, stdout, stderr)
}

// DLQListLimitDefault is how many dead letters dlq list prints unless told
// otherwise: 100.
const DLQListLimitDefault = 100

// deadLetter is one message of LEDGER_DLQ, decoded from its subject and
// headers (docs/contract.md §5). Header values that are not numbers (an invalid
// event's) read as 0.
type deadLetter struct {
	StreamSeq uint64 `json:"stream_seq"`
	Subject   string `json:"subject"`
	// Partition and Task are nil and empty for <prefix>.dlq.invalid.
	Partition         *int   `json:"partition"`
	Task              string `json:"task,omitempty"`
	EventID           string `json:"event_id"`
	Version           int64  `json:"version,omitempty"`
	Type              string `json:"type,omitempty"`
	Holder            string `json:"holder,omitempty"`
	Generation        int64  `json:"generation,omitempty"`
	Verdict           string `json:"verdict"`
	Reason            string `json:"reason"`
	CurrentGeneration int64  `json:"current_generation,omitempty"`
	CurrentHolder     string `json:"current_holder,omitempty"`
	RejectedAt        string `json:"rejected_at"`
	SourceSeq         uint64 `json:"source_seq,omitempty"`
	// Payload is the body when it is JSON; PayloadText the body otherwise.
	Payload     json.RawMessage `json:"payload,omitempty"`
	PayloadText string          `json:"payload_text,omitempty"`

	header nats.Header
	data   []byte
	// unusable says why the dead letter cannot be replayed, if it cannot.
	unusable string
}

func newDeadLetter(subj wire.Subjects, seq uint64, subject string, h nats.Header, data []byte) deadLetter {
	letter, err := wire.DecodeDeadLetter(h, data)
	num := func(name string) int64 {
		n, _ := wire.ParseInt(letter.Header.Get(name))
		return n
	}
	oh := letter.Header
	// The holder is the one the original subject named (a Ledger-Holder
	// header is optional, and only an echo of it).
	holder := oh.Get(wire.HeaderHolder)
	if h, _, _, perr := subj.ParseIn(letter.SourceSubject); perr == nil {
		holder = h
	}
	d := deadLetter{StreamSeq: seq, Subject: subject, EventID: wire.EventIDOf(oh.Get(wire.HeaderMsgID)),
		Version: num(wire.HeaderVersion), Type: oh.Get(wire.HeaderType), Holder: holder,
		Generation: num(wire.HeaderGeneration), Verdict: string(letter.Verdict), Reason: letter.Reason,
		CurrentGeneration: letter.CurrentGeneration, CurrentHolder: letter.CurrentHolder,
		RejectedAt: h.Get(wire.HeaderRejectedAt), SourceSeq: letter.SourceSeq,
		header: oh, data: data}
	if p, ok := rawJSON(data); ok {
		d.Payload = p
	} else {
		d.PayloadText = string(data)
	}
	p, task, why := parseDLQSubject(subj, subject)
	switch {
	case err != nil:
		d.unusable = "its ledger headers are unreadable: " + err.Error()
	case letter.Truncated >= 0:
		d.unusable = fmt.Sprintf("its body was cut to fit the dead-letter stream (%d bytes originally); publish a corrected event instead", letter.Truncated)
	case letter.HeadersDropped >= 0:
		d.unusable = fmt.Sprintf("its headers (%d bytes) were too large to keep; publish a corrected event instead", letter.HeadersDropped)
	case why != "":
		d.unusable = why
	case !wire.ValidHolder(holder):
		d.unusable = "the holder that sent it is unknown (no Ledger-Source-Subject); publish a corrected event instead"
	}
	if why == "" {
		d.Partition, d.Task = &p, task
	}
	return d
}

// parseDLQSubject reads <prefix>.dlq.<partition>.<task>; why says what is
// wrong with any other subject.
func parseDLQSubject(subj wire.Subjects, subject string) (partition int, task, why string) {
	if subject == subj.DLQInvalid() {
		return 0, "", "its original subject was unusable (" + subject + "), so where it belongs is unknown; publish a corrected event instead"
	}
	if !strings.HasPrefix(subject, dlqBase(subj)) {
		return 0, "", fmt.Sprintf("subject %s is not under %s (wrong -prefix?)", subject, subj.DLQAll())
	}
	p, task, err := subj.ParseDLQ(subject)
	if err != nil {
		return 0, "", err.Error()
	}
	return p, task, ""
}

// dlqBase is "<prefix>.dlq.".
func dlqBase(subj wire.Subjects) string { return strings.TrimSuffix(subj.DLQAll(), ">") }

// dlqFilter selects dead letters. The partition and task narrow the
// consumer's subject filter; verdicts and reasons are matched here.
type dlqFilter struct {
	verdicts, reasons string
	ids               string
	task              string
	partition         int
}

// dlqVerdicts are the verdicts that produce a dead letter.
var dlqVerdicts = []string{string(wire.VerdictInvalid), string(wire.VerdictStale), string(wire.VerdictConflict), string(wire.VerdictGap)}

func (df *dlqFilter) register(f *Flags) {
	f.StringVar(&df.verdicts, "verdict", "", "only these verdicts, comma separated: "+strings.Join(dlqVerdicts, ", "))
	f.StringVar(&df.reasons, "reason", "", "only these reasons, comma separated (superseded, gap_timeout, bad_payload, ...)")
	f.StringVar(&df.ids, "id", "", "only these event ids (Nats-Msg-Id), comma separated")
	f.StringVar(&df.task, "task", "", "only this task")
	f.IntVar(&df.partition, "partition", -1, "only this partition (-1: all)")
}

func (df *dlqFilter) validate() error {
	for _, v := range splitList(df.verdicts) {
		if !slices.Contains(dlqVerdicts, v) {
			return Usagef("-verdict %q: dead letters have verdict %s", v, strings.Join(dlqVerdicts, ", "))
		}
	}
	if df.task != "" && !wire.ValidID(df.task) {
		return Usagef("-task %q is not 1..%d characters of [A-Za-z0-9_-]", df.task, wire.MaxIDLen)
	}
	if df.partition < -1 {
		return Usagef("-partition must be >= 0, got %d", df.partition)
	}
	return nil
}

// set reports whether any filter was given.
func (df *dlqFilter) set() bool {
	return df.verdicts != "" || df.reasons != "" || df.ids != "" || df.task != "" || df.partition >= 0
}

// byIDOnly reports whether the filter names event ids and nothing broader:
// a precise choice, like -seq, that needs no -all to replay.
func (df *dlqFilter) byIDOnly() bool {
	return df.ids != "" && df.verdicts == "" && df.reasons == "" && df.task == "" && df.partition < 0
}

// subject is the subject filter of the consumer that reads the DLQ.
func (df *dlqFilter) subject(subj wire.Subjects) string {
	switch {
	case df.partition >= 0 && df.task != "":
		return subj.DLQ(df.partition, df.task)
	case df.partition >= 0:
		return subj.DLQ(df.partition, "*")
	case df.task != "":
		return dlqBase(subj) + "*." + df.task
	}
	return subj.DLQAll()
}

func (df *dlqFilter) match(d deadLetter) bool {
	if vs := splitList(df.verdicts); len(vs) > 0 && !slices.Contains(vs, d.Verdict) {
		return false
	}
	if rs := splitList(df.reasons); len(rs) > 0 && !slices.Contains(rs, d.Reason) {
		return false
	}
	if ids := splitList(df.ids); len(ids) > 0 && !slices.Contains(ids, d.EventID) {
		return false
	}
	return true
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// scanDLQ calls fn with every dead letter that matches df, in stream order,
// up to limit (0: no limit); more reports that further ones matched. It
// reads with an ordered consumer (ephemeral, no acks): nothing is consumed.
func scanDLQ(ctx context.Context, js jetstream.JetStream, subj wire.Subjects, df *dlqFilter, limit int,
	fn func(deadLetter) error) (more bool, err error) {
	s, err := stream(ctx, js, wire.StreamDLQ)
	if err != nil {
		return false, err
	}
	cctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	cons, err := s.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{df.subject(subj)}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return false, fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return false, fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
	}
	defer it.Stop()
	if info := cons.CachedInfo(); info == nil || info.NumPending == 0 {
		return false, nil
	}
	n := 0
	for {
		nctx, cancel := context.WithTimeout(ctx, RequestTimeout)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			return false, fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return false, fmt.Errorf("read %s: %w", wire.StreamDLQ, err)
		}
		d := newDeadLetter(subj, meta.Sequence.Stream, m.Subject(), m.Headers(), m.Data())
		if df.match(d) {
			if limit > 0 && n == limit {
				return true, nil
			}
			if err := fn(d); err != nil {
				return false, err
			}
			n++
		}
		if meta.NumPending == 0 {
			return false, nil
		}
	}
}

// DLQList prints dead letters without consuming them ("dlq list").
func DLQList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl dlq list", "[-verdict V] [-reason R] [-task T] [-partition N] [-limit N]",
		"List the dead letters in LEDGER_DLQ, oldest first, without consuming them.", stderr)
	var df dlqFilter
	df.register(f)
	limit := f.Int("limit", DLQListLimitDefault, "print at most this many (0: all)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	if err := df.validate(); err != nil {
		return err
	}
	if *limit < 0 {
		return Usagef("-limit must be >= 0, got %d", *limit)
	}
	nc, js, err := f.JetStream()
	if err != nil {
		return err
	}
	defer nc.Close()

	var t *table
	if !f.JSON {
		t = newTable(stdout, "SEQ", "SUBJECT", "EVENT ID", "VERSION", "VERDICT", "REASON", "HOLDER/GEN", "CURRENT", "REJECTED AT")
	}
	n := 0
	more, err := scanDLQ(ctx, js, f.Subjects(), &df, *limit, func(d deadLetter) error {
		n++
		if f.JSON {
			return writeJSON(stdout, d)
		}
		t.row(d.StreamSeq, d.Subject, orDash(d.EventID), d.Version, d.Verdict, d.Reason,
			holderGen(d.Holder, d.Generation), holderGen(d.CurrentHolder, d.CurrentGeneration), orDash(d.RejectedAt))
		return nil
	})
	if t != nil {
		if n == 0 {
			fmt.Fprintln(stdout, "no dead letters match")
		} else if ferr := t.flush(); ferr != nil && err == nil {
			err = ferr
		}
	}
	if more {
		fmt.Fprintf(stderr, "more dead letters match: raise -limit (0 for all)\n")
	}
	return err
}

func holderGen(holder string, gen int64) string {
	if holder == "" && gen == 0 {
		return "-"
	}
	return fmt.Sprintf("%s/%d", orDash(holder), gen)
}

// seqList is a repeatable flag of stream sequences, each a number or a
// comma-separated list.
type seqList []uint64

func (s *seqList) String() string {
	parts := make([]string, len(*s))
	for i, n := range *s {
		parts[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(parts, ",")
}

func (s *seqList) Set(v string) error {
	for _, p := range splitList(v) {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil || n == 0 {
			return errors.New("want stream sequences (positive integers), repeated or comma separated")
		}
		*s = append(*s, n)
	}
	return nil
}
