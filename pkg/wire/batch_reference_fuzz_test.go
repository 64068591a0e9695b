package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// batchSeeds are bodies where a hand-written JSON reader most easily parts
// from encoding/json: key case and folding, escapes, repeated keys, nulls,
// numbers as strings, invalid UTF-8, nesting depth, whitespace.
func batchSeeds() []string {
	ev := func(fields string) string {
		return `{"event_id":"01J00000000000000000000000","task":"t","version":1,"type":"x"` + fields + `}`
	}
	return []string{
		`[` + ev(`,"payload":{"a":1}`) + `]`,
		`[` + ev(`,"payload":null,"kind":"snapshot"`) + `,` + ev(`,"payload":[1,"x",true,null,-0.5e+3]`) + `]`,
		" \t\n[ " + ev(`, "payload" : { "a" : [ 1 , 2 ] } `) + " ]\r\n",
		`[{"EVENT_ID":"01J00000000000000000000000","Task":"t","VERSION":1,"tYpE":"x","Payload":1}]`,
		`[{"event_id":"01J00000000000000000000000","tas\u212a":"t","ver\u017fion":2,"type":"x"}]`,
		"[{\"event_id\":\"01J00000000000000000000000\",\"ta\u017fk\":\"t\",\"version\":2,\"type\":\"x\"}]",
		`[{"event\u005fid":"01J00000000000000000000000","task":"t\u002db","version":"1","type":"\ud83d\ude00"}]`,
		`[` + ev(`,"task":"u","task":null,"version":2,"version":null,"payload":{},"payload":null`) + `]`,
		`[` + ev(`,"event_id":"01J00000000000000000000001","kind":"events","kind":""`) + `]`,
		`[` + ev(`,"version":"1e3","type":"\ud800","task":"\u00e9t\u00e9"`) + `]`,
		`[` + ev(`,"version":"01"`) + `]`,
		`[` + ev(`,"version":"1.","x":1`) + `]`,
		`[` + ev(`,"version":true`) + `]`,
		`[` + ev(`,"task":1`) + `]`,
		`[` + ev(`,"unknown":{"a":[{"b":"\u0000"}]},"other":"\\\"\/\b\f\n\r\t"`) + `]`,
		"[" + ev(`,"type":"`+"\xff\xfe"+`","payload":"`+"\xc3"+`"`) + "]",
		"[" + ev(`,"`+"\xff"+`":1`) + "]",
		`null`, `[]`, `[null]`, `[` + ev(``) + `,null]`, `[[]]`, `["x"]`, `{}`, `[` + ev(``) + `]x`,
		`[` + ev(``) + `,]`, `[{"event_id":"01j00000000000000000000000","task":"t"}]`,
		`[` + ev(`,"payload":01`) + `]`, `[` + ev(`,"payload":1.`) + `]`, `[` + ev(`,"payload":-`) + `]`,
		`[` + ev(`,"payload":tru`) + `]`, `[` + ev(`,"payload":"\x"`) + `]`, `[` + ev(`,"payload":"\u12"`) + `]`,
		"[" + ev(`,"payload":"a`+"\t"+`b"`) + "]", `[` + ev(`,"payload":{"a" 1}`) + `]`,
		`[` + ev(`,"payload":{"a":1,}`) + `]`, `[` + ev(`,"payload":[1 2]`) + `]`,
		`[` + ev(``) + `,` + ev(``) + `,` + ev(``) + `]`,
	}
}

// FuzzDecodeBatchMatchesReference: the scanner accepts exactly the batches
// the reflection decoder it replaced accepts once strictBatchKeys has
// refused inexact, unknown and repeated keys and versions that are not
// numbers, into the same messages; it refuses the others for the same
// reason, naming the same ids. Details agree but for a JSON error's wording.
// So every batch it accepts has each key exactly once.
//
// Switch: skip the seen[f] check in batchScanner.object; seed 21 (a task
// given twice) fails. Folding keys with strings.ToLower in fieldOf fails
// seed 9 ("EVENT_ID").
func FuzzDecodeBatchMatchesReference(f *testing.F) {
	hdr := "Nats-Msg-Id: batch-01J00000000000000000000000:ab\nLedger-Generation: 1\nLedger-Kind: x\nLedger-Batch: "
	for _, body := range batchSeeds() {
		for _, n := range []string{"1", "2", "3"} {
			f.Add("ledger.in.w.1.3", hdr+n, []byte(body))
		}
	}
	f.Add("ledger.in.w.3", hdr+"1", []byte(batchSeeds()[0]))
	f.Add("ledger.in.w.1.3", hdr+"1\nLedger-Batch: 1", []byte(batchSeeds()[0]))
	f.Fuzz(func(t *testing.T, subject, header string, data []byte) {
		matchesReference(t, subject, header, data)
		// Mutations seldom keep Ledger-Batch right: try the body's own count too.
		var elems []json.RawMessage
		if json.Unmarshal(data, &elems) == nil && len(elems) > 0 {
			lines := []string{HeaderBatch + ": " + strconv.Itoa(len(elems))}
			for _, line := range strings.Split(header, "\n") {
				if k, _, _ := strings.Cut(line, ":"); k != HeaderBatch {
					lines = append(lines, line)
				}
			}
			matchesReference(t, subject, strings.Join(lines, "\n"), data)
		}
	})
}

// matchesReference fails t unless DecodeBatch and decodeBatchReference
// decode the message alike; header is lines of "key: value".
func matchesReference(t *testing.T, subject, header string, data []byte) {
	s := Subjects{}
	h := nats.Header{}
	for _, line := range strings.Split(header, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k != "" {
			h[k] = append(h[k], strings.TrimPrefix(v, " "))
		}
	}
	want, wantBad := s.decodeBatchReference(subject, h, data)
	got, gotBad := s.DecodeBatch(subject, h, data)
	if (wantBad == nil) != (gotBad == nil) {
		t.Fatalf("reference says %v, scanner says %v", wantBad, gotBad)
	}
	if got.Holder != want.Holder || got.Partition != want.Partition || !reflect.DeepEqual(got.IDs, want.IDs) {
		t.Fatalf("scanner: %q %d %q; reference: %q %d %q",
			got.Holder, got.Partition, got.IDs, want.Holder, want.Partition, want.IDs)
	}
	if wantBad != nil {
		const jsonErr = "the body is not a JSON array of events"
		wj, gj := strings.HasPrefix(wantBad.Detail, jsonErr), strings.HasPrefix(gotBad.Detail, jsonErr)
		if gotBad.Reason != wantBad.Reason || wj != gj || !wj && gotBad.Detail != wantBad.Detail || got.Events != nil {
			t.Fatalf("reference says %v, scanner says %v", wantBad, gotBad)
		}
		return
	}
	if len(got.Events) != len(want.Events) {
		t.Fatalf("scanner: %d events; reference: %d", len(got.Events), len(want.Events))
	}
	for i, g := range got.Events {
		w := want.Events[i]
		if g.Subject != w.Subject || !reflect.DeepEqual(g.Header, w.Header) ||
			(g.Data == nil) != (w.Data == nil) || !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("event %d: scanner %q %q %q; reference %q %q %q",
				i, g.Subject, g.Header, g.Data, w.Subject, w.Header, w.Data)
		}
	}
}

// Bodies too large for the fuzzer to mutate usefully match the reference
// too: the benchmark's batch of 256 events, and nesting up to and beyond
// encoding/json's limit of 10,000 levels (counting the array and the event).
//
// Switch: raise maxJSONDepth by one; the 9,999-level payload is accepted.
func TestBatchScannerMatchesReferenceOnLargeBodies(t *testing.T) {
	t.Parallel()
	m := benchBatch(t)
	matchesReference(t, m.Subject, "Ledger-Generation: 42\nLedger-Batch: 256", m.Data)
	hdr := "Ledger-Generation: 1\nLedger-Batch: 1"
	ev := `{"event_id":"01J00000000000000000000000","task":"t","version":1,"type":"x","%s":%s}`
	for _, depth := range []int{9997, 9998, 9999, 10000} {
		for _, key := range []string{"payload", "other"} {
			for _, open := range []string{"[", "{\"a\":"} {
				close := map[string]string{"[": "]", "{\"a\":": "}"}[open]
				v := strings.Repeat(open, depth) + "1" + strings.Repeat(close, depth)
				matchesReference(t, "ledger.in.w.1.3", hdr, fmt.Appendf(nil, "["+ev+"]", key, v))
			}
		}
	}
	deep := strings.Repeat("[", 9998) + strings.Repeat("]", 9998)
	_, bad := Subjects{}.DecodeBatch("ledger.in.w.1.3", nats.Header{HeaderGeneration: {"1"}, HeaderBatch: {"1"}},
		fmt.Appendf(nil, "["+ev+"]", "payload", deep))
	if bad != nil {
		t.Fatalf("a payload 9,998 levels deep is refused: %v", bad)
	}
}
