package wire

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
)

// decodeBatchReference is DecodeBatch as it was first written, on
// encoding/json's reflection: the reference the scanner is held to
// (FuzzDecodeBatchMatchesReference) and measured against (BenchmarkDecodeBatch).
func (s Subjects) decodeBatchReference(subject string, h nats.Header, data []byte) (DecodedBatch, *Invalid) {
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
	var elems []refBatchElem
	if err := json.Unmarshal(data, &elems); err != nil {
		return bad("the body is not a JSON array of events: %.200v", err)
	}
	if int64(len(elems)) != count {
		return bad("header %s says %d events, the body has %d", HeaderBatch, count, len(elems))
	}
	for i := range elems {
		if !ValidEventID(elems[i].EventID) {
			return bad("event %d: event_id %.80q is not a ULID", i, elems[i].EventID)
		}
	}
	d.Events = make([]*nats.Msg, len(elems))
	for i := range elems {
		d.Events[i] = s.refBatchEventMsg(holder, p, h, &elems[i])
	}
	return d, nil
}

// refBatchElem is one event of a batch's body as the reference reads it.
type refBatchElem struct {
	EventID string          `json:"event_id"`
	Task    string          `json:"task"`
	Version json.Number     `json:"version"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
	Kind    string          `json:"kind"`
}

// refBatchEventMsg is e as the single-event message it stands for.
func (s Subjects) refBatchEventMsg(holder string, p int, batch nats.Header, e *refBatchElem) *nats.Msg {
	h := make(nats.Header, len(batch)+3)
	for k, vs := range batch {
		if k != HeaderBatch {
			h[k] = vs
		}
	}
	h[HeaderMsgID] = []string{e.EventID}
	h[HeaderVersion] = []string{e.Version.String()}
	h[HeaderType] = []string{e.Type}
	if e.Kind != "" {
		h[HeaderKind] = []string{e.Kind}
	}
	var payload []byte
	if len(e.Payload) > 0 && string(e.Payload) != "null" {
		payload = e.Payload
	}
	return &nats.Msg{Subject: s.In(holder, p, e.Task), Header: h, Data: payload}
}
