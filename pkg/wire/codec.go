package wire

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// The contract's messages as Go values, and their one encoding each: every
// producer and consumer of the contract (the ingest, the projector, the SDK,
// ledgerctl and the tests) builds and reads them here.

// Inbound is an event as a worker publishes it to LEDGER_IN (docs/contract.md §2).
type Inbound struct {
	// ID is the event id, a ULID: the idempotency key.
	ID        string
	Partition int
	Task      string
	// Holder is <principal>.<instance>: it travels in the subject, where
	// the NATS server's permissions decide who may publish it.
	Holder     string
	Generation int64
	Version    int64
	Type       string
	// Payload is the event's JSON; empty means null.
	Payload []byte
	// Kind is the kind of task the event is for: KindSnapshot, or
	// KindEvents ("" means the same; the header is then left out).
	Kind string
}

// InboundMsg is e as a LEDGER_IN message. Its Nats-Msg-Id is the event id
// and the content token (ContentToken), so that LEDGER_IN drops only an
// identical re-send.
func (s Subjects) InboundMsg(e Inbound) *nats.Msg {
	m := nats.NewMsg(s.In(e.Holder, e.Partition, e.Task))
	gen, ver := strconv.FormatInt(e.Generation, 10), strconv.FormatInt(e.Version, 10)
	m.Header.Set(HeaderMsgID, MsgID(e.ID, ContentToken(m.Subject, gen, ver, e.Type, e.Payload)))
	m.Header.Set(HeaderGeneration, gen)
	m.Header.Set(HeaderVersion, ver)
	m.Header.Set(HeaderType, e.Type)
	if e.Kind != "" && e.Kind != KindEvents {
		m.Header.Set(HeaderKind, e.Kind)
	}
	m.Data = e.Payload
	return m
}

// Invalid is why a message is not an event: the invalid verdict's reason
// and a detail in words.
type Invalid struct {
	Reason string
	Detail string
}

func (e *Invalid) Error() string { return e.Reason + ": " + e.Detail }

// DecodedInbound is what DecodeInbound makes of a LEDGER_IN message.
type DecodedInbound struct {
	Inbound
	// SubjectOK is false when the subject itself is unusable (then the
	// dead letter goes to <prefix>.dlq.invalid).
	SubjectOK bool
	// HeaderBytes is the size of the message's headers as NATS frames
	// them.
	HeaderBytes int
}

// DecodeInbound reads a LEDGER_IN message into an event, or says why it is
// invalid. It checks what travels outside the payload: the subject (which
// names the holder), the header limits, that each required header is there
// once, that numbers are decimal integers, and that a Ledger-Holder header,
// if sent, names the subject's holder. Ids, types, ranges and the payload
// are the fence's to check (pkg/fence), so each rule lives in one place.
func (s Subjects) DecodeInbound(subject string, h nats.Header, data []byte) (DecodedInbound, *Invalid) {
	var d DecodedInbound
	values := 0
	d.HeaderBytes, values = HeaderSize(h)
	holder, p, task, err := s.ParseIn(subject)
	if err != nil {
		// The holder and the id are read all the same: a valid holder gets
		// its invalid receipt, matched by the event id.
		d.Holder = holder
		d.ID, _ = single(h, HeaderMsgID, ReasonMissingEventID)
		d.ID = EventIDOf(d.ID)
		return d, &Invalid{ReasonBadSubject, err.Error()}
	}
	d.SubjectOK = true
	d.Holder, d.Partition, d.Task = holder, p, task

	var bad *Invalid
	note := func(inv *Invalid) {
		if bad == nil {
			bad = inv
		}
	}
	msgID, err := single(h, HeaderMsgID, ReasonMissingEventID)
	note(asInvalid(err))
	id, token, ok := SplitMsgID(msgID)
	if !ok {
		note(&Invalid{ReasonBadEventID, fmt.Sprintf("header %s: token %.80q after the event id is not 1..%d of [A-Za-z0-9_-]",
			HeaderMsgID, token, MaxMsgTokenLen)})
	}
	d.ID = id
	if vals := h.Values(HeaderHolder); len(vals) > 1 {
		note(&Invalid{ReasonRepeatedHeader, fmt.Sprintf("header %s is given %d times", HeaderHolder, len(vals))})
	} else if len(vals) == 1 && vals[0] != holder {
		note(&Invalid{ReasonHolderMismatch, fmt.Sprintf("header %s says %q, the subject %q", HeaderHolder, vals[0], holder)})
	}
	d.Type, err = single(h, HeaderType, ReasonMissingType)
	note(asInvalid(err))
	d.Generation, err = decimal(h, HeaderGeneration, ReasonMissingGen, ReasonBadGeneration)
	note(asInvalid(err))
	d.Version, err = decimal(h, HeaderVersion, ReasonMissingVersion, ReasonBadVersion)
	note(asInvalid(err))
	d.Kind = KindEvents
	if vals := h.Values(HeaderKind); len(vals) > 1 {
		note(&Invalid{ReasonRepeatedHeader, fmt.Sprintf("header %s is given %d times", HeaderKind, len(vals))})
	} else if len(vals) == 1 {
		if !ValidKind(vals[0]) {
			note(&Invalid{ReasonBadKind, fmt.Sprintf("header %s: %.80q is neither %s nor %s", HeaderKind, vals[0], KindEvents, KindSnapshot)})
		}
		d.Kind = vals[0]
	}
	// The ids are read first so that even this verdict reaches its holder.
	if d.HeaderBytes > MaxHeaderBytes || values > MaxHeaderValues {
		return d, &Invalid{ReasonHeadersTooLarge, fmt.Sprintf("headers are %d bytes in %d values; at most %d bytes and %d values are allowed",
			d.HeaderBytes, values, MaxHeaderBytes, MaxHeaderValues)}
	}
	if bad != nil {
		return d, bad
	}
	d.Payload = data
	return d, nil
}

func asInvalid(err error) *Invalid {
	var inv *Invalid
	if errors.As(err, &inv) {
		return inv
	}
	return nil
}

// HeaderSize is the size of h as NATS frames it ("NATS/1.0\r\n", a
// "Name: value\r\n" line per value, a blank line), and its value count.
func HeaderSize(h nats.Header) (bytes, values int) {
	if len(h) == 0 {
		return 0, 0
	}
	bytes = len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			bytes += len(k) + len(": \r\n") + len(v)
			values++
		}
	}
	return bytes, values
}

// single returns the one value of a required header.
func single(h nats.Header, name, missing string) (string, error) {
	vals := h.Values(name)
	switch {
	case len(vals) == 0 || vals[0] == "":
		return "", &Invalid{missing, fmt.Sprintf("header %s is required", name)}
	case len(vals) > 1:
		return vals[0], &Invalid{ReasonRepeatedHeader, fmt.Sprintf("header %s is given %d times", name, len(vals))}
	}
	return vals[0], nil
}

// decimal returns a required header as a decimal integer.
func decimal(h nats.Header, name, missing, bad string) (int64, error) {
	s, err := single(h, name, missing)
	if err != nil {
		return 0, err
	}
	n, err := ParseInt(s)
	if err != nil {
		return 0, &Invalid{bad, fmt.Sprintf("header %s: %v", name, err)}
	}
	return n, nil
}

// LogCopy is a committed event as LEDGER_LOG carries it (docs/contract.md §4).
type LogCopy struct {
	// Seq is the event's position in the PostgreSQL log.
	Seq        int64
	EventID    string
	Partition  int
	Task       string
	Version    int64
	Type       string
	Holder     string
	Generation int64
	// CommittedAt is the database clock's time of the commit.
	CommittedAt time.Time
	Payload     []byte
	// WouldReject is set on an event committed under the observe fence
	// mode that enforce would have refused: "stale/<reason>".
	WouldReject string
	// Snapshot is set on a copy of a snapshot task's event: header
	// Ledger-Kind: snapshot (docs/contract.md §14).
	Snapshot bool
}

// LogMsg is c as a LEDGER_LOG message. It is built with few allocations:
// one copy per committed event, at tens of thousands a second. The header
// map is made at its final size, its values share one backing array, and
// the numbers are formatted into one buffer.
func (s Subjects) LogMsg(c *LogCopy) *nats.Msg {
	var buf [80]byte
	nums := strconv.AppendInt(buf[:0], c.Seq, 10)
	seqEnd := len(nums)
	nums = strconv.AppendInt(nums, int64(c.Partition), 10)
	partEnd := len(nums)
	nums = strconv.AppendInt(nums, c.Version, 10)
	verEnd := len(nums)
	nums = strconv.AppendInt(nums, c.Generation, 10)
	numStr := string(nums)
	vals := [...]string{
		c.EventID,
		numStr[:seqEnd],
		c.Task,
		numStr[seqEnd:partEnd],
		numStr[partEnd:verEnd],
		c.Type,
		c.Holder,
		numStr[verEnd:],
		FormatTime(c.CommittedAt),
	}
	v := vals[:] // one allocation for all nine values
	m := &nats.Msg{
		Subject: s.Log(c.Partition, c.Task),
		Header: nats.Header{
			HeaderMsgID:       v[0:1:1],
			HeaderSeq:         v[1:2:2],
			HeaderTask:        v[2:3:3],
			HeaderPartition:   v[3:4:4],
			HeaderVersion:     v[4:5:5],
			HeaderType:        v[5:6:6],
			HeaderHolder:      v[6:7:7],
			HeaderGeneration:  v[7:8:8],
			HeaderCommittedAt: v[8:9:9],
		},
		Data: c.Payload,
	}
	if c.WouldReject != "" {
		m.Header[HeaderWouldReject] = []string{c.WouldReject}
	}
	if c.Snapshot {
		m.Header[HeaderKind] = kindSnapshotValue
	}
	return m
}

// kindSnapshotValue is the one Ledger-Kind value of a snapshot task's log
// copies; shared, never modified.
var kindSnapshotValue = []string{KindSnapshot}

// ValidWouldReject reports whether w is what a would_reject says: the
// stale verdict and one of its reasons.
func ValidWouldReject(w string) bool {
	switch w {
	case "stale/" + ReasonSuperseded, "stale/" + ReasonNotHolder, "stale/" + ReasonLeaseExpired, "stale/" + ReasonNoLease:
		return true
	}
	return false
}

// DecodeLog reads a LEDGER_LOG message. Every header of docs/contract.md §4 must be
// there and well formed, and agree with the subject; seq, version and
// generation start at 1.
func (s Subjects) DecodeLog(subject string, h nats.Header, data []byte) (LogCopy, error) {
	var c LogCopy
	p, task, err := s.ParseLog(subject)
	if err != nil {
		return c, err
	}
	var errs []error
	num := func(name string) int64 {
		v := h.Get(name)
		n, err := ParseInt(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("header %s: %w", name, err))
		}
		return n
	}
	c.Seq, c.Version, c.Generation = num(HeaderSeq), num(HeaderVersion), num(HeaderGeneration)
	if c.Seq < 1 || c.Version < 1 || c.Generation < 1 {
		errs = append(errs, fmt.Errorf("seq %d, version %d and generation %d must each be at least 1", c.Seq, c.Version, c.Generation))
	}
	c.Partition, c.Task = int(num(HeaderPartition)), h.Get(HeaderTask)
	c.EventID, c.Type, c.Holder = h.Get(HeaderMsgID), h.Get(HeaderType), h.Get(HeaderHolder)
	if at, err := time.Parse(time.RFC3339Nano, h.Get(HeaderCommittedAt)); err != nil {
		errs = append(errs, fmt.Errorf("header %s: %w", HeaderCommittedAt, err))
	} else {
		c.CommittedAt = at
	}
	if c.Partition != p || c.Task != task {
		errs = append(errs, fmt.Errorf("headers say task %q on partition %d, the subject %q", c.Task, c.Partition, subject))
	}
	if c.EventID == "" || c.Type == "" || c.Holder == "" {
		errs = append(errs, errors.New("an id, type or holder header is missing"))
	}
	c.Payload = data
	if w, ok := h[HeaderWouldReject]; ok {
		c.WouldReject = h.Get(HeaderWouldReject)
		if len(w) != 1 || !ValidWouldReject(c.WouldReject) {
			errs = append(errs, fmt.Errorf("header %s: %q is not stale/<reason>", HeaderWouldReject, w))
		}
	}
	if k, ok := h[HeaderKind]; ok {
		if len(k) != 1 || !ValidKind(k[0]) {
			errs = append(errs, fmt.Errorf("header %s: %q is not %s or %s", HeaderKind, k, KindEvents, KindSnapshot))
		} else {
			c.Snapshot = k[0] == KindSnapshot
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("log copy %s: %w", subject, err)
	}
	return c, nil
}

// Rejection is what a dead letter adds to the message it copies
// (docs/contract.md §5).
type Rejection struct {
	Verdict Verdict
	Reason  string
	// CurrentGeneration and CurrentHolder describe the partition's lease as
	// the ledger saw it; zero when unknown.
	CurrentGeneration int64
	CurrentHolder     string
	RejectedAt        time.Time
	// SourceSeq is the message's sequence in LEDGER_IN.
	SourceSeq uint64
}

// DeadLetterSlack is room left below a dead letter's size limit for what
// the server adds when it frames a message.
const DeadLetterSlack = 512

// DeadLetterMsg is the LEDGER_DLQ copy of a rejected message: its body and
// headers plus r and the subject it was published on (source), on subject.
// It always fits in limit bytes: headers over the inbound limits are
// dropped (Ledger-Headers-Dropped records their size), a body that would
// not fit is cut (Ledger-Truncated records its size), and a worker's own
// headers of the ledger's names or a publisher's Nats-Expected-*
// expectations are not carried over.
func DeadLetterMsg(subject, source string, orig nats.Header, data []byte, r Rejection, limit int) *nats.Msg {
	m := nats.NewMsg(subject)
	if hb, values := HeaderSize(orig); hb <= MaxHeaderBytes && values <= MaxHeaderValues {
		for k, vs := range orig {
			if strings.HasPrefix(k, HeaderExpectedPrefix) || slices.Contains(DeadLetterHeaders, k) {
				continue
			}
			m.Header[k] = slices.Clone(vs)
		}
	} else {
		m.Header.Set(HeaderHeadersDropped, strconv.Itoa(hb))
	}
	m.Header.Set(HeaderVerdict, string(r.Verdict))
	m.Header.Set(HeaderReason, r.Reason)
	if r.CurrentGeneration > 0 {
		m.Header.Set(HeaderCurrentGeneration, strconv.FormatInt(r.CurrentGeneration, 10))
		m.Header.Set(HeaderCurrentHolder, r.CurrentHolder)
	}
	m.Header.Set(HeaderRejectedAt, FormatTime(r.RejectedAt))
	m.Header.Set(HeaderSourceSeq, strconv.FormatUint(r.SourceSeq, 10))
	if len(source) <= MaxHeaderBytes/4 {
		m.Header.Set(HeaderSourceSubject, source)
	}
	m.Data = data
	FitDeadLetter(m, limit)
	return m
}

// FitDeadLetter cuts m's body so that headers and body fit in limit bytes,
// and records the original size in Ledger-Truncated. With no room left for
// any body, the body is dropped.
func FitDeadLetter(m *nats.Msg, limit int) {
	hdr, _ := HeaderSize(m.Header)
	if hdr+len(m.Data)+DeadLetterSlack <= limit {
		return
	}
	if m.Header.Get(HeaderTruncated) == "" {
		m.Header.Set(HeaderTruncated, strconv.Itoa(len(m.Data)))
	}
	hdr, _ = HeaderSize(m.Header)
	keep := max(0, limit-hdr-DeadLetterSlack)
	m.Data = m.Data[:min(keep, len(m.Data))]
}

// DeadLetterWithoutBody is dead letter m without its body, for a stream
// that refused m for its size: Ledger-Truncated records the body's size,
// unless m was cut already.
func DeadLetterWithoutBody(m *nats.Msg) *nats.Msg {
	out := nats.NewMsg(m.Subject)
	for k, vs := range m.Header {
		out.Header[k] = vs
	}
	if out.Header.Get(HeaderTruncated) == "" {
		out.Header.Set(HeaderTruncated, strconv.Itoa(len(m.Data)))
	}
	return out
}

// DeadLetterWithoutOriginal is dead letter m without the original
// message's body and headers: the ledger's headers (the verdict, where it
// came from) and the event id stay, and Ledger-Truncated and
// Ledger-Headers-Dropped tell what was left out.
func DeadLetterWithoutOriginal(m *nats.Msg) *nats.Msg {
	out := nats.NewMsg(m.Subject)
	dropped := nats.Header{}
	for k, vs := range m.Header {
		if k == HeaderMsgID || slices.Contains(DeadLetterHeaders, k) {
			out.Header[k] = vs
		} else {
			dropped[k] = vs
		}
	}
	if out.Header.Get(HeaderTruncated) == "" {
		out.Header.Set(HeaderTruncated, strconv.Itoa(len(m.Data)))
	}
	if out.Header.Get(HeaderHeadersDropped) == "" {
		hb, _ := HeaderSize(dropped)
		out.Header.Set(HeaderHeadersDropped, strconv.Itoa(hb))
	}
	return out
}

// DeadLetter is a LEDGER_DLQ message read back: the original message's
// headers and body, and the rejection.
type DeadLetter struct {
	Rejection
	// SourceSubject is the subject the original was published on.
	SourceSubject string
	// Header holds the original message's headers, without the ledger's.
	Header nats.Header
	Data   []byte
	// Truncated is the original body's size when it was cut, else -1;
	// HeadersDropped the size of the original headers when they were
	// dropped, else -1.
	Truncated, HeadersDropped int
}

// DecodeDeadLetter reads a LEDGER_DLQ message. Values of the original
// message that are not numbers stay readable in Header; only the ledger's
// own headers must be well formed.
func DecodeDeadLetter(h nats.Header, data []byte) (DeadLetter, error) {
	d := DeadLetter{Header: nats.Header{}, Data: data, Truncated: -1, HeadersDropped: -1}
	for k, vs := range h {
		if !slices.Contains(DeadLetterHeaders, k) {
			d.Header[k] = vs
		}
	}
	var errs []error
	d.Verdict, d.Reason = Verdict(h.Get(HeaderVerdict)), h.Get(HeaderReason)
	if !d.Verdict.Final() {
		errs = append(errs, fmt.Errorf("header %s: %q is not a verdict", HeaderVerdict, d.Verdict))
	}
	d.CurrentHolder, d.SourceSubject = h.Get(HeaderCurrentHolder), h.Get(HeaderSourceSubject)
	opt := func(name string) int64 {
		v := h.Get(name)
		if v == "" {
			return -1
		}
		n, err := ParseInt(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("header %s: %w", name, err))
		}
		return n
	}
	d.CurrentGeneration = max(opt(HeaderCurrentGeneration), 0)
	d.SourceSeq = uint64(max(opt(HeaderSourceSeq), 0))
	d.Truncated, d.HeadersDropped = int(opt(HeaderTruncated)), int(opt(HeaderHeadersDropped))
	if at := h.Get(HeaderRejectedAt); at != "" {
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			errs = append(errs, fmt.Errorf("header %s: %w", HeaderRejectedAt, err))
		}
		d.RejectedAt = t
	}
	return d, errors.Join(errs...)
}
