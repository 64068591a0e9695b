package wire

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// appendLogElemByReflection is appendLogElem as encoding/json writes it, the
// reference the hand-written encoder must match byte for byte.
func appendLogElemByReflection(b []byte, c *LogCopy) ([]byte, error) {
	e := logBatchElem{Seq: c.Seq, EventID: c.EventID, Task: c.Task, Version: c.Version, Type: c.Type,
		Holder: c.Holder, Generation: c.Generation, CommittedAt: FormatTime(c.CommittedAt), WouldReject: c.WouldReject}
	if len(bytes.TrimSpace(c.Payload)) > 0 {
		e.Payload = c.Payload
	}
	if c.Snapshot {
		e.Kind = KindSnapshot
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		return nil, err
	}
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...), nil
}

// FuzzAppendLogElemMatchesEncodingJSON checks the hand-written encoder of a
// log batch's events against encoding/json: the same bytes for every copy,
// and an error for the same payloads (not JSON). Switch: let
// appendQuoted copy every string as it is, and a quote or a control
// character in a string parts them.
func FuzzAppendLogElemMatchesEncodingJSON(f *testing.F) {
	f.Add(int64(7), "01JD0000000000000000000001", "report-7", int64(3), "progress", "reports.pod-a", int64(2),
		int64(1764756000123456789), []byte(`{"step": 1, "note": "<a & b>"}`), "", false)
	f.Add(int64(1), "id \"quoted\"\\", "t\u2028x", int64(1), "type\x01", "h\u00e9.i", int64(1), int64(0),
		[]byte(" [1, 2.5e3, \"\u2029\", null] "), "stale/superseded", true)
	f.Add(int64(9), "<&>", "t", int64(2), "x", "p.i", int64(4), int64(-1), []byte(`{"a":`), "", false)
	f.Add(int64(9), "e", "t", int64(2), "x", "p.i", int64(4), int64(5), []byte("\xff"), "", true)
	f.Add(int64(9), "e\xff", "t", int64(2), "x", "p.i", int64(4), int64(5), []byte("  "), "", false)
	f.Fuzz(func(t *testing.T, seq int64, id, task string, version int64, typ, holder string, gen, at int64,
		payload []byte, would string, snapshot bool) {
		c := LogCopy{Seq: seq, EventID: id, Task: task, Version: version, Type: typ, Holder: holder,
			Generation: gen, CommittedAt: time.Unix(0, at).In(time.FixedZone("x", 3600)), Payload: payload,
			WouldReject: would, Snapshot: snapshot}
		got, gotErr := appendLogElem([]byte("prefix"), &c)
		want, wantErr := appendLogElemByReflection([]byte("prefix"), &c)
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("error %v, encoding/json's %v, for %+v", gotErr, wantErr, c)
		}
		if gotErr == nil && !bytes.Equal(got, want) {
			t.Fatalf("wrote\n%s\nencoding/json writes\n%s", got, want)
		}
	})
}
