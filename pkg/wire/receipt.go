package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// The receipt (docs/contract.md §3, "Receipts"): the verdict of one event,
// sent on core NATS to the holder that published it. The ingest encodes it
// with AppendReceipt; the Go SDK and the tests read it with DecodeReceipt.

// Receipt is the verdict of one event, sent to <prefix>.receipt.<holder>.
type Receipt struct {
	EventID           string  `json:"event_id"`
	Task              string  `json:"task"`
	Partition         int     `json:"partition"`
	Version           int64   `json:"version"`
	Verdict           Verdict `json:"verdict"`
	Reason            string  `json:"reason"`
	Seq               int64   `json:"seq"`
	Generation        int64   `json:"generation"`
	CurrentGeneration int64   `json:"current_generation"`
	// FenceMode is the partition's effective fence mode when the event was
	// decided, "enforce" or "observe" (docs/contract.md §13); absent on an
	// invalid receipt, decided before the fence.
	FenceMode string `json:"fence_mode,omitempty"`
	// WouldReject, on a commit under observe, is what enforce would have
	// answered: "stale/<reason>".
	WouldReject string `json:"would_reject,omitempty"`
}

// AppendReceipt appends r as JSON to b, without reflection: one receipt is
// encoded per event.
func AppendReceipt(b []byte, r *Receipt) []byte {
	b = append(b, `{"event_id":`...)
	b = appendJSONString(b, r.EventID)
	b = append(b, `,"task":`...)
	b = appendJSONString(b, r.Task)
	b = append(b, `,"partition":`...)
	b = strconv.AppendInt(b, int64(r.Partition), 10)
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, r.Version, 10)
	b = append(b, `,"verdict":`...)
	b = appendJSONString(b, string(r.Verdict))
	b = append(b, `,"reason":`...)
	b = appendJSONString(b, r.Reason)
	b = append(b, `,"seq":`...)
	b = strconv.AppendInt(b, r.Seq, 10)
	b = append(b, `,"generation":`...)
	b = strconv.AppendInt(b, r.Generation, 10)
	b = append(b, `,"current_generation":`...)
	b = strconv.AppendInt(b, r.CurrentGeneration, 10)
	if r.FenceMode != "" {
		b = append(b, `,"fence_mode":`...)
		b = appendJSONString(b, r.FenceMode)
	}
	if r.WouldReject != "" {
		b = append(b, `,"would_reject":`...)
		b = appendJSONString(b, r.WouldReject)
	}
	return append(b, '}')
}

// DecodeReceipt reads a receipt; its verdict must be one of the contract's.
func DecodeReceipt(data []byte) (Receipt, error) {
	if r, ok := scanReceipt(data); ok {
		return r, nil
	}
	return decodeReceiptReflect(data)
}

// decodeReceiptReflect is DecodeReceipt for a receipt in any form.
func decodeReceiptReflect(data []byte) (Receipt, error) {
	var r Receipt
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("receipt: %w", err)
	}
	if !r.Verdict.Final() || r.EventID == "" {
		return r, fmt.Errorf("receipt: %q is not a receipt of a contract verdict", data)
	}
	return r, nil
}

// appendJSONString appends s as a JSON string, as json.Marshal writes it.
// Ids, types and reasons are plain ASCII and are copied as they are;
// anything else (the id of an invalid message, say) goes through
// encoding/json.
func appendJSONString(b []byte, s string) []byte { return appendQuoted(b, s, true) }

// appendQuoted is appendJSONString, escaping HTML characters outside plain
// ASCII strings or not, as an encoder with SetEscapeHTML(escapeHTML) does.
func appendQuoted(b []byte, s string, escapeHTML bool) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(escapeHTML)
			_ = enc.Encode(s) // a string always encodes
			return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
