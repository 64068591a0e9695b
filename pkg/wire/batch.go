package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// A batch is several events of one holder and one partition in one
// LEDGER_IN message (docs/contract.md §2, "Batches"). The ledger decides
// each of its events as if it had been sent alone, so the decoder turns a
// batch back into the single-event messages its events stand for, and the
// ingest decodes those with DecodeInbound: one set of rules for both.

// HeaderBatch is the number of events in a batch message, and of
// receipts in a batched receipt: 1..MaxBatch.
const HeaderBatch = "Ledger-Batch"

// MaxBatch is the most events one batch message carries: 1,000.
const MaxBatch = 1000

// BatchMsgIDPrefix starts a batch's Nats-Msg-Id: batch-<first event id>:<token>.
const BatchMsgIDPrefix = "batch-"

// ReasonBadBatch is the invalid verdict's reason for a batch message that
// does not decode: its dead letter is the whole message.
const ReasonBadBatch = "bad_batch"

// InBatch is the subject a holder publishes a batch of partition's events
// to: <prefix>.in.<principal>.<instance>.<partition>.
func (s Subjects) InBatch(holder string, partition int) string {
	return s.p() + ".in." + holder + "." + strconv.Itoa(partition)
}

// InBatchPartition is the filter of partition's batches in LEDGER_IN, from
// any holder: <prefix>.in.*.*.<partition>.
func (s Subjects) InBatchPartition(partition int) string {
	return s.p() + ".in.*.*." + strconv.Itoa(partition)
}

// IsInBatch reports whether subject has the shape of a batch subject: four
// tokens after <prefix>.in (a single event's has five).
func (s Subjects) IsInBatch(subject string) bool {
	rest, ok := strings.CutPrefix(subject, s.p()+".in.")
	return ok && strings.Count(rest, ".") == 2
}

// ParseInBatch splits a batch subject into holder and partition. Like
// ParseIn, a valid holder is returned also with an error about the rest.
func (s Subjects) ParseInBatch(subject string) (holder string, partition int, err error) {
	rest, ok := strings.CutPrefix(subject, s.p()+".in.")
	i := strings.LastIndexByte(rest, '.')
	if !ok || i < 0 {
		return "", 0, fmt.Errorf("subject %q is not %s.in.<principal>.<instance>.<partition>", subject, s.p())
	}
	holder, ps := rest[:i], rest[i+1:]
	if !ValidHolder(holder) {
		return "", 0, fmt.Errorf("subject %q: holder %q is not <principal>.<instance>", subject, holder)
	}
	p, err := parsePartition(ps)
	if err != nil {
		return holder, 0, fmt.Errorf("subject %q: %w", subject, err)
	}
	return holder, p, nil
}

// BatchMsg is events as one LEDGER_IN batch message. They must share
// holder, partition and generation, number 1..MaxBatch, and carry JSON
// payloads (empty is null); a task's events must be in version order. The
// Nats-Msg-Id is batch-<first event id>:<token>, the token ContentToken
// of the subject, Ledger-Generation, Ledger-Batch, an empty type and the
// body, so LEDGER_IN drops only an identical re-send.
func (s Subjects) BatchMsg(events []Inbound) (*nats.Msg, error) {
	if len(events) == 0 || len(events) > MaxBatch {
		return nil, fmt.Errorf("wire: a batch has 1..%d events, not %d", MaxBatch, len(events))
	}
	first := events[0]
	size := 2
	for i := range events {
		e := &events[i]
		if e.Holder != first.Holder || e.Partition != first.Partition || e.Generation != first.Generation {
			return nil, errors.New("wire: a batch's events must share holder, partition and generation")
		}
		size += len(e.Payload) + len(e.Task) + len(e.Type) + 100
	}
	body := make([]byte, 0, size)
	body = append(body, '[')
	for i := range events {
		if i > 0 {
			body = append(body, ',')
		}
		body = appendBatchEvent(body, &events[i])
	}
	body = append(body, ']')
	m := nats.NewMsg(s.InBatch(first.Holder, first.Partition))
	gen, n := strconv.FormatInt(first.Generation, 10), strconv.Itoa(len(events))
	m.Header.Set(HeaderMsgID, BatchMsgIDPrefix+MsgID(first.ID, ContentToken(m.Subject, gen, n, "", body)))
	m.Header.Set(HeaderGeneration, gen)
	m.Header.Set(HeaderBatch, n)
	m.Data = body
	return m, nil
}

func appendBatchEvent(b []byte, e *Inbound) []byte {
	b = append(b, `{"event_id":`...)
	b = appendJSONString(b, e.ID)
	b = append(b, `,"task":`...)
	b = appendJSONString(b, e.Task)
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, e.Version, 10)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, e.Type)
	b = append(b, `,"payload":`...)
	if len(e.Payload) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, e.Payload...)
	}
	if e.Kind != "" && e.Kind != KindEvents {
		b = append(b, `,"kind":`...)
		b = appendJSONString(b, e.Kind)
	}
	return append(b, '}')
}

// DecodedBatch is what DecodeBatch makes of a batch message.
type DecodedBatch struct {
	// Holder is the subject's holder, "" when the subject has none.
	Holder    string
	Partition int
	// Events are the batch's events, in order, each as the single-event
	// message it stands for: subject <prefix>.in.<holder>.<partition>.<task>,
	// Nats-Msg-Id the bare event id, the batch's other headers, and
	// Ledger-Version, Ledger-Type and Ledger-Kind from its element.
	Events []*nats.Msg
	// IDs, of a batch that does not decode, are the event ids that can be
	// read from it: they get its invalid receipt.
	IDs []string
}

// DecodeBatch reads a batch message into its events, or says why it does
// not decode (reason bad_batch): a subject without holder or partition, a
// body that is not a JSON array of event objects, a key that is not one
// of an event's six exact names or is repeated, a version that is not a
// JSON number, a count that is not Ledger-Batch, more than MaxBatch events,
// or an element without a valid event_id. Everything else about an event
// (its version's value, type, payload, generation, task id) is decided per
// event, as for a single message.
// The events' payloads are slices of data, so data must not change while
// they are in use.
func (s Subjects) DecodeBatch(subject string, h nats.Header, data []byte) (DecodedBatch, *Invalid) {
	var d DecodedBatch
	holder, p, err := s.ParseInBatch(subject)
	d.Holder = holder
	if err != nil {
		d.IDs = readableIDs(data)
		return d, &Invalid{ReasonBadBatch, err.Error()}
	}
	d.Partition = p
	bad := func(format string, args ...any) (DecodedBatch, *Invalid) {
		d.Events, d.IDs = nil, readableIDs(data)
		return d, &Invalid{ReasonBadBatch, fmt.Sprintf(format, args...)}
	}
	if hb, values := HeaderSize(h); hb > MaxHeaderBytes || values > MaxHeaderValues {
		return bad("headers are %d bytes in %d values; at most %d bytes and %d values are allowed",
			hb, values, MaxHeaderBytes, MaxHeaderValues)
	}
	count, err := decimal(h, HeaderBatch, ReasonBadBatch, ReasonBadBatch)
	if err != nil {
		return bad("%v", err)
	}
	if count < 1 || count > MaxBatch {
		return bad("header %s: %d is not 1..%d", HeaderBatch, count, MaxBatch)
	}
	b, n, err := scanBatch(data, int(count))
	if rule := (*batchRuleError)(nil); errors.As(err, &rule) {
		return bad("%s", rule.detail)
	}
	if err != nil {
		return bad("the body is not a JSON array of events: %.200v", err)
	}
	if int64(n) != count {
		return bad("header %s says %d events, the body has %d", HeaderBatch, count, n)
	}
	for i := range b.elems {
		if id := b.value(i, fieldEventID); !ValidEventID(id) {
			return bad("event %d: event_id %.80q is not a ULID", i, id)
		}
	}
	d.Events = s.batchEventMsgs(holder, p, h, &b)
	return d, nil
}

// batchEventMsgs are b's events as the single-event messages they stand for.
// Their messages, header values and subjects share a few allocations.
func (s Subjects) batchEventMsgs(holder string, p int, batch nats.Header, b *scannedBatch) []*nats.Msg {
	elems := b.elems
	base := make([]string, 0, len(batch))
	for k := range batch {
		if k != HeaderBatch {
			base = append(base, k)
		}
	}
	prefix := s.In(holder, p, "")
	size := 0
	for i := range elems {
		size += len(prefix) + len(b.value(i, fieldTask))
	}
	var subjects strings.Builder
	subjects.Grow(size)
	for i := range elems {
		subjects.WriteString(prefix)
		subjects.WriteString(b.value(i, fieldTask))
	}
	all := subjects.String()
	msgs := make([]nats.Msg, len(elems))
	values := make([]string, 4*len(elems))
	out := make([]*nats.Msg, len(elems))
	at := 0
	for i := range elems {
		e, task := &elems[i], b.value(i, fieldTask)
		h := make(nats.Header, len(base)+3)
		for _, k := range base {
			h[k] = batch[k]
		}
		v := values[4*i : 4*i+4 : 4*i+4]
		v[0], v[1] = b.value(i, fieldEventID), b.value(i, fieldVersion)
		v[2], v[3] = b.value(i, fieldType), b.value(i, fieldKind)
		// Capped slices: an append to one header never writes into the next.
		h[HeaderMsgID], h[HeaderVersion], h[HeaderType] = v[0:1:1], v[1:2:2], v[2:3:3]
		if v[3] != "" {
			h[HeaderKind] = v[3:4:4]
		}
		m := &msgs[i]
		m.Subject, m.Header = all[at:at+len(prefix)+len(task)], h
		at += len(prefix) + len(task)
		if len(e.Payload) > 0 && string(e.Payload) != "null" {
			m.Data = e.Payload
		}
		out[i] = m
	}
	return out
}

// readableIDs are the valid event ids of a body that does not decode as a
// batch, as far as it is an array of objects with one exact event_id key:
// a receipt never goes to one of two ids an element names.
func readableIDs(data []byte) []string {
	var elems []json.RawMessage
	if json.Unmarshal(data, &elems) != nil {
		return nil
	}
	var ids []string
	for i, raw := range elems {
		if i >= MaxBatch {
			break
		}
		if id, ok := exactEventID(raw); ok && ValidEventID(id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// exactEventID is the string value of the one key "event_id" of the
// object raw; ok is false for anything else.
func exactEventID(raw []byte) (id string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", false
	}
	n := 0
	for dec.More() {
		key, err := dec.Token()
		var v json.RawMessage
		if err != nil || dec.Decode(&v) != nil {
			return "", false
		}
		if key == "event_id" {
			n++
			if json.Unmarshal(v, &id) != nil {
				return "", false
			}
		}
	}
	return id, n == 1
}

// ReceiptsMsg is the batched receipt of rs to holder: one message on
// <prefix>.receipt.<holder>, header Ledger-Batch, body a JSON array of the
// receipts. Only a client that sends batches gets one.
func (s Subjects) ReceiptsMsg(holder string, rs []Receipt) *nats.Msg {
	b := make([]byte, 0, 256*len(rs)+2)
	b = append(b, '[')
	for i := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendReceipt(b, &rs[i])
	}
	b = append(b, ']')
	return &nats.Msg{Subject: s.Receipt(holder), Header: nats.Header{HeaderBatch: {strconv.Itoa(len(rs))}}, Data: b}
}

// DecodeReceipts reads a batched receipt's body: a JSON array of receipts,
// each a receipt DecodeReceipt accepts.
func DecodeReceipts(data []byte) ([]Receipt, error) {
	if rs, ok := scanReceipts(data); ok {
		return rs, nil
	}
	return decodeReceiptsReflect(data)
}

// decodeReceiptsReflect is DecodeReceipts for receipts in any form.
func decodeReceiptsReflect(data []byte) ([]Receipt, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("receipts: %w", err)
	}
	out := make([]Receipt, 0, len(raw))
	for _, r := range raw {
		rc, err := decodeReceiptReflect(r)
		if err != nil {
			return out, err
		}
		out = append(out, rc)
	}
	return out, nil
}

// ReceiptsOf reads a message on a receipt subject: a batched receipt
// (header Ledger-Batch) or a single one.
func ReceiptsOf(h nats.Header, data []byte) ([]Receipt, error) {
	if h.Get(HeaderBatch) != "" {
		return DecodeReceipts(data)
	}
	r, err := DecodeReceipt(data)
	if err != nil {
		return nil, err
	}
	return []Receipt{r}, nil
}
