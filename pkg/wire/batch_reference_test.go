package wire

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
)

// decodeBatchReference is DecodeBatch as it was first written, on
// encoding/json's reflection, with strictBatchKeys in front of it: the
// reference the scanner is held to (FuzzDecodeBatchMatchesReference) and
// measured against (BenchmarkDecodeBatch).
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
	if detail := strictBatchKeys(data); detail != "" {
		return bad("%s", detail)
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

// strictBatchKeys is the detail of the first element of a batch body, in
// the body's order, whose keys break the strict rules: a key not one of the
// six exact names, a repeated key, a version not a JSON number or null. It
// is "" when there is none before the body stops being a JSON array of
// objects whose string fields are strings; json.Unmarshal then says why.
// It walks the body by tokens, not by the scanner's code.
func strictBatchKeys(data []byte) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return ""
	}
	for n := 0; dec.More(); n++ {
		t, err := dec.Token()
		switch {
		case err != nil:
			return ""
		case t == nil:
			continue // a null element
		case t != json.Delim('{'):
			return ""
		}
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return ""
			}
			key, _ := kt.(string)
			v, err := dec.Token()
			if err != nil {
				return ""
			}
			if _, ok := v.(json.Delim); ok && !skipTokens(dec) {
				return "" // not JSON, or nested too deep: json.Unmarshal says so
			}
			_, isNum := v.(json.Number)
			_, isStr := v.(string)
			switch {
			case !refBatchKeys[key]:
				return fmt.Sprintf("event %d: key %.40q is not one of %s", n, key, batchFieldList)
			case seen[key]:
				return fmt.Sprintf("event %d: key %q repeated", n, key)
			case key == "version" && !isNum && v != nil:
				return fmt.Sprintf("event %d: version is not a JSON number", n)
			case key != "version" && key != "payload" && !isStr && v != nil:
				return "" // a type error for json.Unmarshal
			}
			seen[key] = true
		}
		if _, err := dec.Token(); err != nil { // '}'
			return ""
		}
	}
	return ""
}

// refBatchKeys are an event's keys, by their exact names.
var refBatchKeys = map[string]bool{"event_id": true, "task": true, "version": true,
	"type": true, "kind": true, "payload": true}

// skipTokens reads the rest of the array or object just opened, an event's
// value at nesting level 3, and reports whether it is JSON within
// maxJSONDepth levels.
func skipTokens(dec *json.Decoder) bool {
	for level := 3; level > 2; {
		if level > maxJSONDepth {
			return false
		}
		t, err := dec.Token()
		if err != nil {
			return false
		}
		switch t {
		case json.Delim('['), json.Delim('{'):
			level++
		case json.Delim(']'), json.Delim('}'):
			level--
		}
	}
	return true
}
