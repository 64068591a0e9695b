package wire_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/wire"
)

// logCopies is n copies of partition 3, over two tasks, in commit order,
// with each optional field set somewhere.
func logCopies(n int) []wire.LogCopy {
	at := time.Date(2026, 12, 3, 10, 0, 0, 123456789, time.UTC)
	out := make([]wire.LogCopy, n)
	for i := range out {
		out[i] = wire.LogCopy{Seq: int64(100 + i), EventID: fmt.Sprintf("01JD%022d", i), Partition: 3,
			Task: []string{"report-7", "report-8"}[i%2], Version: int64(1 + i/2), Type: "progress",
			Holder: "reports.pod-a", Generation: 2, CommittedAt: at.Add(time.Duration(i) * time.Millisecond),
			Payload: []byte(fmt.Sprintf(`{"step": %d, "note": "<a & b>"}`, i))}
	}
	if n > 1 {
		out[1].Payload = nil
		out[1].Snapshot = true
	}
	if n > 2 {
		out[2].WouldReject = "stale/" + wire.ReasonSuperseded
	}
	return out
}

// sameCopies fails unless got is want, payloads compared as JSON values
// (a batch compacts them, as PostgreSQL's jsonb may reformat a copy's).
func sameCopies(t *testing.T, got, want []wire.LogCopy) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d copies, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if !jsonEqual(t, g.Payload, w.Payload) {
			t.Fatalf("copy %d: payload %s, want %s", i, g.Payload, w.Payload)
		}
		g.Payload, w.Payload = nil, nil
		if !g.CommittedAt.Equal(w.CommittedAt) {
			t.Fatalf("copy %d: committed at %v, want %v", i, g.CommittedAt, w.CommittedAt)
		}
		g.CommittedAt, w.CommittedAt = time.Time{}, time.Time{}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("copy %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		t.Fatalf("payloads %q and %q are not both JSON", a, b)
	}
	return reflect.DeepEqual(x, y)
}

func TestLogBatchCarriesItsCopies(t *testing.T) {
	subj := wire.Subjects{}
	want := logCopies(5)
	msgs, err := subj.LogBatchMsgs(want, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 {
		t.Fatalf("%d messages for 5 small copies, want 1", len(msgs))
	}
	m := msgs[0]
	if m.Subject != "ledger.log.3.~batch" || m.Header.Get(wire.HeaderBatch) != "5" ||
		m.Header.Get(wire.HeaderPartition) != "3" || m.Header.Get(wire.HeaderMsgID) != "log-3-100-104" {
		t.Fatalf("subject %s, headers %v", m.Subject, m.Header)
	}
	if !strings.Contains(string(m.Data), `"<a & b>"`) {
		t.Fatalf("a payload's text was escaped: %s", m.Data)
	}
	got, err := subj.DecodeLogCopies(m.Subject, m.Header, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	sameCopies(t, got, want)
}

// A per-event copy reads as one event through the same call, so a reader
// takes both forms.
func TestDecodeLogCopiesTakesAPerEventCopy(t *testing.T) {
	subj := wire.Subjects{Prefix: "acme"}
	want := logCopies(3)[2:]
	m := subj.LogMsg(&want[0])
	if subj.IsLogBatch(m.Subject) {
		t.Fatalf("%s taken for a batch", m.Subject)
	}
	got, err := subj.DecodeLogCopies(m.Subject, m.Header, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	sameCopies(t, got, want)
}

// No task id is the batch token, so a task's subject is never a batch's,
// and a partition's filter holds its batches.
func TestLogBatchSubjectIsNoTasks(t *testing.T) {
	subj := wire.Subjects{}
	if wire.ValidID(wire.LogBatchToken) {
		t.Fatalf("%q is a valid task id", wire.LogBatchToken)
	}
	if !subjectMatches(subj.LogPartition(3), subj.LogBatch(3)) || !subjectMatches(subj.LogAll(), subj.LogBatch(3)) {
		t.Fatalf("%s is not under %s and %s", subj.LogBatch(3), subj.LogPartition(3), subj.LogAll())
	}
	if subj.IsLogBatch(subj.Log(3, "batch")) || !subj.IsLogBatch(subj.LogBatch(12)) {
		t.Fatal("IsLogBatch mistakes a subject")
	}
}

// subjectMatches is NATS's subject matching of a filter, enough for these.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

// A partition's events go in as many messages as the size and MaxBatch
// call for, each within the limit, in order.
func TestLogBatchSplitsAtTheMessageLimit(t *testing.T) {
	subj := wire.Subjects{}
	for _, c := range []struct {
		name     string
		n, limit int
	}{{"by size", 40, 2048}, {"by count", wire.MaxBatch + 7, 1 << 30}} {
		t.Run(c.name, func(t *testing.T) {
			want := logCopies(c.n)
			msgs, err := subj.LogBatchMsgs(want, c.limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) < 2 {
				t.Fatalf("%d copies in %d message(s) under a limit of %d bytes", c.n, len(msgs), c.limit)
			}
			var got []wire.LogCopy
			for _, m := range msgs {
				if size := len(m.Subject) + len(m.Data) + headerBytes(m.Header); size > c.limit {
					t.Fatalf("a message of %d bytes, over %d", size, c.limit)
				}
				part, err := subj.DecodeLogBatch(m.Subject, m.Header, m.Data)
				if err != nil {
					t.Fatal(err)
				}
				if len(part) > wire.MaxBatch {
					t.Fatalf("%d events in one batch", len(part))
				}
				got = append(got, part...)
			}
			sameCopies(t, got, want)
		})
	}
}

func headerBytes(h nats.Header) int {
	n, _ := wire.HeaderSize(h)
	return n
}

func TestLogBatchMsgsRefusesWhatNoBatchCarries(t *testing.T) {
	subj := wire.Subjects{}
	mixed := logCopies(2)
	mixed[1].Partition = 4
	huge := logCopies(1)
	huge[0].Payload = []byte(`"` + strings.Repeat("x", 5000) + `"`)
	for name, copies := range map[string][]wire.LogCopy{"none": nil, "two partitions": mixed, "over the limit alone": huge} {
		if msgs, err := subj.LogBatchMsgs(copies, 4096); err == nil {
			t.Errorf("%s: %d messages, want an error", name, len(msgs))
		}
	}
}

// What the decoder refuses, each with the reason it names.
func TestDecodeLogBatchRefusesMalformedBatches(t *testing.T) {
	subj := wire.Subjects{}
	msgs, err := subj.LogBatchMsgs(logCopies(2), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	good := msgs[0]
	one := `{"seq":1,"event_id":"01JD0000000000000000000000","task":"t","version":1,"type":"x","holder":"p.i","generation":1,"committed_at":"2026-12-03T10:00:00Z"}`
	with := func(header string, value string) nats.Header {
		h := nats.Header{}
		for k, v := range good.Header {
			h[k] = v
		}
		h.Set(header, value)
		return h
	}
	for _, c := range []struct {
		name, subject string
		h             nats.Header
		data, says    string
	}{
		{"count", good.Subject, with(wire.HeaderBatch, "3"), string(good.Data), "holds 2"},
		{"no count", good.Subject, with(wire.HeaderBatch, ""), string(good.Data), wire.HeaderBatch},
		{"partition", good.Subject, with(wire.HeaderPartition, "4"), string(good.Data), wire.HeaderPartition},
		{"subject", "ledger.log.03.~batch", good.Header, string(good.Data), "leading zeros"},
		{"not a batch subject", "ledger.log.3.t", good.Header, string(good.Data), "not ledger.log"},
		{"unknown key", good.Subject, with(wire.HeaderBatch, "1"), `[` + strings.Replace(one, `"seq"`, `"extra":1,"seq"`, 1) + `]`, "unknown field"},
		{"version as text", good.Subject, with(wire.HeaderBatch, "1"), `[` + strings.Replace(one, `"version":1`, `"version":"1"`, 1) + `]`, "version"},
		{"version 0", good.Subject, with(wire.HeaderBatch, "1"), `[` + strings.Replace(one, `"version":1`, `"version":0`, 1) + `]`, "at least 1"},
		{"task", good.Subject, with(wire.HeaderBatch, "1"), `[` + strings.Replace(one, `"task":"t"`, `"task":"a.b"`, 1) + `]`, "not a task id"},
		{"no holder", good.Subject, with(wire.HeaderBatch, "1"), `[` + strings.Replace(one, `"holder":"p.i",`, ``, 1) + `]`, "missing"},
		{"time", good.Subject, with(wire.HeaderBatch, "1"), `[` + strings.Replace(one, `2026-12-03T10:00:00Z`, `yesterday`, 1) + `]`, "committed_at"},
		{"kind", good.Subject, with(wire.HeaderBatch, "1"), `[` + strings.Replace(one, `"type":"x"`, `"type":"x","kind":"other"`, 1) + `]`, "kind"},
		{"would reject", good.Subject, with(wire.HeaderBatch, "1"), `[` + strings.Replace(one, `"type":"x"`, `"type":"x","would_reject":"gap/x"`, 1) + `]`, "would_reject"},
		{"repeated key", good.Subject, with(wire.HeaderBatch, "1"), `[` + strings.Replace(one, `"type":"x"`, `"type":"x","type":"y"`, 1) + `]`, "repeated"},
		{"key in another case", good.Subject, with(wire.HeaderBatch, "1"), `[` + strings.Replace(one, `"type"`, `"Type"`, 1) + `]`, "unknown field"},
		{"trailing", good.Subject, with(wire.HeaderBatch, "1"), `[` + one + `] []`, "end of the body"},
		{"not an array", good.Subject, with(wire.HeaderBatch, "1"), one, "a JSON array"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := subj.DecodeLogBatch(c.subject, c.h, []byte(c.data))
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("%d copies, error %v; want one that says %q", len(got), err, c.says)
			}
			if _, err := subj.DecodeLogCopies(c.subject, c.h, []byte(c.data)); err == nil {
				t.Fatal("DecodeLogCopies took what DecodeLogBatch refuses")
			}
		})
	}
	// The element used above is itself good.
	if got, err := subj.DecodeLogBatch(good.Subject, with(wire.HeaderBatch, "1"), []byte(`[`+one+`]`)); err != nil || len(got) != 1 || got[0].Payload != nil {
		t.Fatalf("%+v, %v", got, err)
	}
}

// FuzzDecodeLogBatch: the log batch decoder never panics, and a batch it
// takes is made again by LogBatchMsgs into one that decodes to the same
// copies.
func FuzzDecodeLogBatch(f *testing.F) {
	subj := wire.Subjects{}
	msgs, err := subj.LogBatchMsgs(logCopies(3), 1<<20)
	if err != nil {
		f.Fatal(err)
	}
	hdr := func(h nats.Header) string {
		var b strings.Builder
		for k, vs := range h {
			for _, v := range vs {
				fmt.Fprintf(&b, "%s: %s\n", k, v)
			}
		}
		return b.String()
	}
	f.Add(msgs[0].Subject, hdr(msgs[0].Header), msgs[0].Data)
	f.Add("ledger.log.3.~batch", "Ledger-Batch: 1\nLedger-Partition: 3",
		[]byte(`[{"seq":1,"event_id":"E","task":"t","version":1,"type":"x","holder":"p.i","generation":1,"committed_at":"2026-12-03T10:00:00Z","payload":null}]`))
	f.Add("ledger.log.3.~batch", "Ledger-Batch: 1\nLedger-Partition: 3", []byte(`[null]`))
	f.Add("ledger.log.3.t", "", []byte(`{}`))
	f.Fuzz(func(t *testing.T, subject, header string, data []byte) {
		h := headerFrom(header)
		got, err := subj.DecodeLogCopies(subject, h, data)
		if err != nil || !subj.IsLogBatch(subject) {
			return
		}
		again, err := subj.LogBatchMsgs(got, 1<<30)
		if err != nil {
			t.Fatalf("a decoded batch does not encode: %v", err)
		}
		var back []wire.LogCopy
		for _, m := range again {
			part, err := subj.DecodeLogBatch(m.Subject, m.Header, m.Data)
			if err != nil {
				t.Fatalf("an encoded batch does not decode: %v\n%s", err, m.Data)
			}
			back = append(back, part...)
		}
		sameCopies(t, back, got)
	})
}

// BenchmarkDecodeLog: a reader's cost per event, of per-event copies and
// of a batch of 256 (ns/op is per event in both).
func BenchmarkDecodeLog(b *testing.B) {
	subj := wire.Subjects{}
	copies := logCopies(256)
	for i := range copies {
		copies[i].Payload = []byte(`{"status":"running","progress":42,"worker":"pod-a","detail":{"step":3,"of":10}}`)
	}
	b.Run("copies", func(b *testing.B) {
		msgs := make([]*nats.Msg, len(copies))
		for i := range copies {
			msgs[i] = subj.LogMsg(&copies[i])
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			m := msgs[i%len(msgs)]
			if _, err := subj.DecodeLogCopies(m.Subject, m.Header, m.Data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("batch", func(b *testing.B) {
		msgs, err := subj.LogBatchMsgs(copies, 1<<20)
		if err != nil || len(msgs) != 1 {
			b.Fatal(err, len(msgs))
		}
		m := msgs[0]
		b.ReportAllocs()
		for b.Loop() {
			if _, err := subj.DecodeLogCopies(m.Subject, m.Header, m.Data); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(copies)), "ns/event")
	})
}

// BenchmarkLogBatchMsgs: the ingest's cost per event of writing a batch of
// 256 copies as log batch messages.
func BenchmarkLogBatchMsgs(b *testing.B) {
	subj := wire.Subjects{}
	copies := logCopies(256)
	for i := range copies {
		copies[i].Payload = []byte(`{"status":"running","progress":42,"worker":"pod-a","detail":{"step":3,"of":10}}`)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := subj.LogBatchMsgs(copies, 1<<20); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(copies)), "ns/event")
}
