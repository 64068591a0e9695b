package wire_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/wire"
)

// FuzzDecodeReceipt: every worker decodes the receipts it is sent, and a
// receipt subject can carry anything someone aimed at it. The decoder never
// panics, accepts only a final verdict with an event id, and what it
// accepts encodes back (AppendReceipt) to a receipt that decodes the same.
func FuzzDecodeReceipt(f *testing.F) {
	for _, s := range []string{
		`{"event_id":"01J","task":"t","partition":3,"version":2,"verdict":"committed","seq":9,"generation":1}`,
		`{"event_id":"01J","verdict":"stale","reason":"superseded","current_generation":4}`,
		`{"event_id":"","verdict":"committed"}`, `{"event_id":"x","verdict":"not_yet"}`, `null`, `[]`, `{"version":1e999}`,
		`{"event_id":"\u0000","verdict":"gap","task":"\ud800"}`, `{"event_id":"a","verdict":"invalid","event_id":"b"}`,
		`{"event_id":"01J","verdict":"committed","seq":9,"fence_mode":"observe","would_reject":"stale/superseded"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := wire.DecodeReceipt(data)
		if err != nil {
			return
		}
		if !r.Verdict.Final() || r.EventID == "" {
			t.Fatalf("%q decoded to a receipt without a final verdict or an id: %+v", data, r)
		}
		again, err := wire.DecodeReceipt(wire.AppendReceipt(nil, &r))
		if err != nil || again != r {
			t.Fatalf("%q: %+v encodes to a receipt that decodes to %+v, %v", data, r, again, err)
		}
	})
}

// FuzzDecodeLogCopy: LEDGER_LOG copies are read by the projector, the ingest
// (the last copy of a task), ledgerctl and the chaos checker. The decoder
// never panics, and a copy it accepts is exactly what LogMsg makes of it.
func FuzzDecodeLogCopy(f *testing.F) {
	f.Add("ledger.log.3.t", "01J", "7", "t", "3", "2", "step", "p.i", "1", "2026-11-30T10:00:00.123456Z", []byte(`{}`))
	f.Add("ledger.log.3.t", "01J", "0", "t", "3", "0", "step", "p.i", "0", "2026-11-30T10:00:00Z", []byte(nil))
	f.Add("ledger.log.3.t", "01J", "7", "u", "4", "2", "step", "p.i", "1", "yesterday", []byte(`x`))
	f.Add("ledger.log.03.t", "", "-1", "t", "03", "+2", "", "", "1e3", "", []byte(nil))
	subjects := wire.Subjects{}
	f.Fuzz(func(t *testing.T, subject, id, seq, task, partition, version, typ, holder, gen, at string, data []byte) {
		h := nats.Header{}
		for k, v := range map[string]string{wire.HeaderMsgID: id, wire.HeaderSeq: seq, wire.HeaderTask: task,
			wire.HeaderPartition: partition, wire.HeaderVersion: version, wire.HeaderType: typ,
			wire.HeaderHolder: holder, wire.HeaderGeneration: gen, wire.HeaderCommittedAt: at} {
			if v != "" {
				h.Set(k, v)
			}
		}
		c, err := subjects.DecodeLog(subject, h, data)
		if err != nil {
			return
		}
		if c.Seq < 1 || c.Version < 1 || c.Generation < 1 || c.Partition < 0 || c.EventID == "" {
			t.Fatalf("accepted a copy out of range: %+v", c)
		}
		m := subjects.LogMsg(&c)
		again, err := subjects.DecodeLog(m.Subject, m.Header, m.Data)
		if err != nil || !again.CommittedAt.Equal(c.CommittedAt) {
			t.Fatalf("%+v: LogMsg makes a copy that decodes to %+v, %v", c, again, err)
		}
		again.CommittedAt, c.CommittedAt = time.Time{}, time.Time{}
		if !reflect.DeepEqual(again, c) {
			t.Fatalf("%+v: LogMsg makes a copy that decodes to %+v", c, again)
		}
	})
}

// FuzzDecodeLogWouldReject: a log copy committed under the observe fence
// mode carries Ledger-Would-Reject. The decoder accepts only stale/<reason>
// there, and a copy it accepts is exactly what LogMsg makes of it.
func FuzzDecodeLogWouldReject(f *testing.F) {
	for _, s := range []string{"stale/superseded", "stale/no_lease", "", "stale/", "conflict/version_taken", "stale/superseded\x00"} {
		f.Add(s)
	}
	subjects := wire.Subjects{}
	f.Fuzz(func(t *testing.T, would string) {
		c := wire.LogCopy{Seq: 7, EventID: "01J", Partition: 3, Task: "t", Version: 2, Type: "step", Holder: "p.i",
			Generation: 1, CommittedAt: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC), Payload: []byte(`{}`)}
		m := subjects.LogMsg(&c)
		m.Header[wire.HeaderWouldReject] = []string{would}
		got, err := subjects.DecodeLog(m.Subject, m.Header, m.Data)
		if err != nil {
			return
		}
		if !wire.ValidWouldReject(got.WouldReject) {
			t.Fatalf("accepted would-reject %q", got.WouldReject)
		}
		again := subjects.LogMsg(&got)
		back, err := subjects.DecodeLog(again.Subject, again.Header, again.Data)
		if err != nil || back.WouldReject != got.WouldReject {
			t.Fatalf("%q: LogMsg makes a copy that decodes to %q, %v", would, back.WouldReject, err)
		}
	})
}

// FuzzDecodeDeadLetter: dead letters carry what workers sent, and
// ledgerctl and the console read them. The decoder never panics, keeps none
// of the ledger's own headers among the original's, and reads its numbers
// as the headers spell them.
func FuzzDecodeDeadLetter(f *testing.F) {
	f.Add("stale", "superseded", "4", "12", "-1", "", "2026-11-30T10:00:00Z", "Ledger-Verdict", "committed", []byte(`{}`))
	f.Add("not_yet", "", "x", "", "3", "2", "soon", "Nats-Msg-Id", "01J", []byte(nil))
	f.Add("invalid", "bad_subject", "", "18446744073709551616", "", "", "", "Ledger-Current-Generation", "9", []byte("\x00"))
	f.Fuzz(func(t *testing.T, verdict, reason, curGen, srcSeq, truncated, dropped, at, extraKey, extraVal string, data []byte) {
		h := nats.Header{}
		for k, v := range map[string]string{wire.HeaderVerdict: verdict, wire.HeaderReason: reason,
			wire.HeaderCurrentGeneration: curGen, wire.HeaderSourceSeq: srcSeq, wire.HeaderTruncated: truncated,
			wire.HeaderHeadersDropped: dropped, wire.HeaderRejectedAt: at} {
			if v != "" {
				h.Set(k, v)
			}
		}
		if extraKey != "" {
			h.Add(extraKey, extraVal)
		}
		d, err := wire.DecodeDeadLetter(h, data)
		for _, k := range wire.DeadLetterHeaders {
			if _, ok := d.Header[k]; ok {
				t.Fatalf("the ledger's header %s is among the original's: %v", k, d.Header)
			}
		}
		if err != nil {
			return
		}
		if !d.Verdict.Final() {
			t.Fatalf("accepted verdict %q", d.Verdict)
		}
		want := int64(-1) // absent
		if truncated != "" {
			want, _ = wire.ParseInt(truncated)
		}
		if int64(d.Truncated) != want {
			t.Fatalf("Truncated %q read as %d", truncated, d.Truncated)
		}
	})
}
