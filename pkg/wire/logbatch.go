package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Log batches: several committed events of one partition in one LEDGER_LOG
// message (docs/internals/log-batches.md). Readers take them beside the
// per-event copies; the ingest does not write them yet.

// LogBatchToken is the last token of a log batch's subject,
// <prefix>.log.<partition>.~batch. No task id can be it, so a batch never
// shares a task's subject, and every filter of a partition
// (<prefix>.log.<p>.*) or of the whole log holds batches unchanged.
const LogBatchToken = "~batch"

// LogBatch is the subject of partition's log batches.
func (s Subjects) LogBatch(partition int) string {
	return s.p() + ".log." + strconv.Itoa(partition) + "." + LogBatchToken
}

// LogBatches is the filter of every partition's log batches.
func (s Subjects) LogBatches() string { return s.p() + ".log.*." + LogBatchToken }

// IsLogBatch reports whether subject is a log batch's (it may still fail
// to decode).
func (s Subjects) IsLogBatch(subject string) bool {
	rest, ok := strings.CutPrefix(subject, s.p()+".log.")
	return ok && strings.HasSuffix(rest, "."+LogBatchToken)
}

// logBatchElem is one event of a log batch, as its JSON object.
type logBatchElem struct {
	Seq         int64           `json:"seq"`
	EventID     string          `json:"event_id"`
	Task        string          `json:"task"`
	Version     int64           `json:"version"`
	Type        string          `json:"type"`
	Holder      string          `json:"holder"`
	Generation  int64           `json:"generation"`
	CommittedAt string          `json:"committed_at"`
	Payload     json.RawMessage `json:"payload,omitempty"`
	Kind        string          `json:"kind,omitempty"`
	WouldReject string          `json:"would_reject,omitempty"`
}

// logBatchHeaderRoom is what a log batch's headers and subject take at
// most, beside its body.
const logBatchHeaderRoom = 256

// LogBatchMsgs is copies, all of one partition and in commit order, as log
// batch messages of at most maxBytes each (the stream's max_msg_size),
// MaxBatch events at most in each. A copy too large to share a message
// goes alone; one too large even alone is an error, as its single copy
// would be.
func (s Subjects) LogBatchMsgs(copies []LogCopy, maxBytes int) ([]*nats.Msg, error) {
	if len(copies) == 0 {
		return nil, errors.New("wire: a log batch needs at least one copy")
	}
	p := copies[0].Partition
	var msgs []*nats.Msg
	var body []byte
	first, n := 0, 0
	flush := func(end int) {
		if n == 0 {
			return
		}
		body = append(body, ']')
		m := &nats.Msg{Subject: s.LogBatch(p), Header: nats.Header{}, Data: body}
		m.Header[HeaderMsgID] = []string{fmt.Sprintf("log-%d-%d-%d", p, copies[first].Seq, copies[end-1].Seq)}
		m.Header[HeaderBatch] = []string{strconv.Itoa(n)}
		m.Header[HeaderPartition] = []string{strconv.Itoa(p)}
		msgs = append(msgs, m)
		body, n = nil, 0
	}
	for i := range copies {
		c := &copies[i]
		if c.Partition != p {
			return nil, fmt.Errorf("wire: a log batch is of one partition: copy %d is of %d, the first of %d", i, c.Partition, p)
		}
		if body == nil {
			body = make([]byte, 0, min(maxBytes, logBatchRoom(copies[i:])))
		}
		// Each copy is written where it goes, after the batch's earlier
		// ones, and moved to a message of its own only when it does not fit.
		at := len(body)
		body = append(body, ',')
		var err error
		if body, err = appendLogElem(body, c); err != nil {
			return nil, err
		}
		size := len(body) - at - 1
		if size+2+logBatchHeaderRoom > maxBytes {
			return nil, fmt.Errorf("wire: the copy of %s version %d is %d bytes, over %d for a message", c.Task, c.Version, size, maxBytes)
		}
		if n > 0 && (n == MaxBatch || len(body)+1+logBatchHeaderRoom > maxBytes) {
			elem := bytes.Clone(body[at+1:])
			body = body[:at]
			flush(i)
			body = append(make([]byte, 0, min(maxBytes, logBatchRoom(copies[i:]))), ',')
			body, at = append(body, elem...), 0
		}
		if n == 0 {
			first = i
			body[at] = '['
		}
		n++
	}
	flush(len(copies))
	return msgs, nil
}

// logBatchRoom is about the bytes of a batch of copies: their payloads and
// the fields around them.
func logBatchRoom(copies []LogCopy) int {
	room := 2
	for i := range min(len(copies), MaxBatch) {
		room += len(copies[i].Payload) + len(copies[i].Task) + len(copies[i].Type) + len(copies[i].Holder) + 160
	}
	return room
}

// appendLogElem appends c as a log batch's JSON object: what encoding/json
// writes of c as a logBatchElem without HTML escaping, written by hand
// because encoding it by reflection was most of a batch's cost (bench
// -external -ingest-profile). A payload is compacted (the two are equal as
// JSON values, which is what readers compare) and must be valid JSON.
func appendLogElem(b []byte, c *LogCopy) ([]byte, error) {
	b = append(b, `{"seq":`...)
	b = strconv.AppendInt(b, c.Seq, 10)
	b = appendQuoted(append(b, `,"event_id":`...), c.EventID, false)
	b = appendQuoted(append(b, `,"task":`...), c.Task, false)
	b = strconv.AppendInt(append(b, `,"version":`...), c.Version, 10)
	b = appendQuoted(append(b, `,"type":`...), c.Type, false)
	b = appendQuoted(append(b, `,"holder":`...), c.Holder, false)
	b = strconv.AppendInt(append(b, `,"generation":`...), c.Generation, 10)
	b = append(b, `,"committed_at":"`...)
	b = append(c.CommittedAt.UTC().AppendFormat(b, time.RFC3339Nano), '"')
	if len(bytes.TrimSpace(c.Payload)) > 0 {
		b = append(b, `,"payload":`...)
		var err error
		if b, err = appendCompactJSON(b, c.Payload); err != nil {
			return nil, fmt.Errorf("wire: the copy of %s version %d: payload: %w", c.Task, c.Version, err)
		}
	}
	if c.Snapshot {
		b = append(b, `,"kind":"`+KindSnapshot+`"`...)
	}
	if c.WouldReject != "" {
		b = appendQuoted(append(b, `,"would_reject":`...), c.WouldReject, false)
	}
	return append(b, '}'), nil
}

// appendCompactJSON appends p compacted, as encoding/json writes a
// json.RawMessage, and fails if p is not valid JSON. A payload stored by
// the fence is valid already; one read back from PostgreSQL's jsonb has
// spaces after its colons and commas.
func appendCompactJSON(b, p []byte) ([]byte, error) {
	if bytes.ContainsAny(p, " \t\r\n") {
		buf := bytes.NewBuffer(b)
		if err := json.Compact(buf, p); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	}
	if !ValidJSON(p) {
		return nil, errors.New("not valid JSON")
	}
	return append(b, p...), nil
}

// DecodeLogBatch reads a log batch: Ledger-Batch and Ledger-Partition must
// agree with the subject and the body, and each event must be what
// DecodeLog asks of a copy. The events come in the batch's order. A payload
// comes as its JSON, and an event without one with an empty payload, as a
// copy's body would.
func (s Subjects) DecodeLogBatch(subject string, h nats.Header, data []byte) ([]LogCopy, error) {
	fail := func(format string, args ...any) ([]LogCopy, error) {
		return nil, fmt.Errorf("log batch %s: %s", subject, fmt.Sprintf(format, args...))
	}
	rest, ok := strings.CutPrefix(subject, s.p()+".log.")
	ps, tok, cut := strings.Cut(rest, ".")
	if !ok || !cut || tok != LogBatchToken {
		return fail("not %s.log.<partition>.%s", s.p(), LogBatchToken)
	}
	p, err := parsePartition(ps)
	if err != nil {
		return fail("%v", err)
	}
	count, err := ParseInt(h.Get(HeaderBatch))
	if err != nil || count < 1 || count > MaxBatch {
		return fail("header %s: %q is not 1..%d", HeaderBatch, h.Get(HeaderBatch), MaxBatch)
	}
	if hp := h.Get(HeaderPartition); hp != ps {
		return fail("header %s says %q, the subject %s", HeaderPartition, hp, ps)
	}
	elems, err := scanLogBatch(data)
	if err != nil {
		return fail("body: %v", err)
	}
	if int64(len(elems)) != count {
		return fail("header %s says %d, the body holds %d", HeaderBatch, count, len(elems))
	}
	out := make([]LogCopy, len(elems))
	var errs []error
	for i := range elems {
		c, err := elems[i].copy(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("event %d: %w", i, err))
		}
		out[i] = c
	}
	if err := errors.Join(errs...); err != nil {
		return fail("%v", err)
	}
	return out, nil
}

// copy is e as the copy of an event of partition p, checked as DecodeLog
// checks a copy's headers.
func (e *logBatchElem) copy(p int) (LogCopy, error) {
	c := LogCopy{Seq: e.Seq, EventID: e.EventID, Partition: p, Task: e.Task, Version: e.Version, Type: e.Type,
		Holder: e.Holder, Generation: e.Generation, WouldReject: e.WouldReject}
	if !bytes.Equal(e.Payload, []byte("null")) {
		c.Payload = e.Payload
	}
	var errs []error
	if c.Seq < 1 || c.Version < 1 || c.Generation < 1 {
		errs = append(errs, fmt.Errorf("seq %d, version %d and generation %d must each be at least 1", c.Seq, c.Version, c.Generation))
	}
	if !ValidID(c.Task) {
		errs = append(errs, fmt.Errorf("task %q is not a task id", c.Task))
	}
	if c.EventID == "" || c.Type == "" || c.Holder == "" {
		errs = append(errs, errors.New("an event_id, type or holder is missing"))
	}
	if at, err := time.Parse(time.RFC3339Nano, e.CommittedAt); err != nil {
		errs = append(errs, fmt.Errorf("committed_at: %w", err))
	} else {
		c.CommittedAt = at
	}
	if c.WouldReject != "" && !ValidWouldReject(c.WouldReject) {
		errs = append(errs, fmt.Errorf("would_reject %q is not stale/<reason>", c.WouldReject))
	}
	switch e.Kind {
	case "", KindEvents:
	case KindSnapshot:
		c.Snapshot = true
	default:
		errs = append(errs, fmt.Errorf("kind %q is not %s or %s", e.Kind, KindEvents, KindSnapshot))
	}
	return c, errors.Join(errs...)
}

// DecodeLogCopies reads any LEDGER_LOG message: a log batch's events, or a
// per-event copy as the one event. Readers of the log call it, so that
// they take both forms.
func (s Subjects) DecodeLogCopies(subject string, h nats.Header, data []byte) ([]LogCopy, error) {
	if s.IsLogBatch(subject) {
		return s.DecodeLogBatch(subject, h, data)
	}
	c, err := s.DecodeLog(subject, h, data)
	if err != nil {
		return nil, err
	}
	return []LogCopy{c}, nil
}
