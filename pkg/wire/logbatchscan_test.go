package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// decodeLogElemsJSON is the reading scanLogBatch replaced: encoding/json,
// no unknown key, one value.
func decodeLogElemsJSON(data []byte) ([]logBatchElem, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var elems []logBatchElem
	if err := dec.Decode(&elems); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errTrailing
	}
	return elems, nil
}

var errTrailing = &json.SyntaxError{}

// FuzzLogBatchScannerMatchesJSON: whatever the scanner takes, encoding/json
// takes too and reads the same. The scanner refuses more: a key spelled in
// another case, a repeated key, a body that is null.
func FuzzLogBatchScannerMatchesJSON(f *testing.F) {
	one := `{"seq":1,"event_id":"E","task":"t","version":2,"type":"x","holder":"p.i","generation":3,"committed_at":"2026-12-03T10:00:00Z","payload":{"a":[1,"\u00e9"]}}`
	for _, s := range []string{
		"[" + one + "]",
		"[" + one + "," + one + "]",
		` [ {"seq":-0,"payload":null,"kind":"snapshot","would_reject":"stale/superseded"} ] `,
		`[{"SEQ":1}]`, `[{"seq":1,"seq":2}]`, `[{"seq":1.0}]`, `[{"seq":1e2}]`, `[{"seq":9223372036854775808}]`,
		`[{"seq":-9223372036854775808}]`, `[{"task":null,"seq":null}]`, `[{"t\u0061sk":"a"}]`, `null`, `[]`, `[null]`,
		`[{"payload":"\xff"}]`, `[{"task":"\xff\xfe"}]`, `[{}] x`, `[{"extra":1}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := scanLogBatch(data)
		if err != nil {
			return
		}
		want, werr := decodeLogElemsJSON(data)
		if werr != nil {
			t.Fatalf("the scanner took what encoding/json refuses (%v): %q", werr, data)
		}
		if len(got) == 0 && len(want) == 0 {
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("the scanner read\n %+v\nencoding/json\n %+v\nfrom %q", got, want, data)
		}
	})
}
