package wire_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/wire"
)

// headerFrom reads "Name: value" lines into a header, as a hostile
// publisher could send them (repeats, empty values, odd names).
func headerFrom(text string) nats.Header {
	h := nats.Header{}
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k == "" {
			continue
		}
		h[k] = append(h[k], strings.TrimPrefix(v, " "))
	}
	return h
}

// FuzzDecodeInbound: the inbound decoder never panics; it either gives an
// event whose fields are exactly what the subject and headers say, or an
// invalid verdict with a contract reason and a detail.
func FuzzDecodeInbound(f *testing.F) {
	valid := "Nats-Msg-Id: 01J00000000000000000000000\nLedger-Generation: 1\nLedger-Version: 2\nLedger-Type: step"
	for _, c := range []struct{ subject, header, data string }{
		{"ledger.in.w.1.3.task", valid, `{"a":1}`},
		{"ledger.in.w.1.3.task", valid + "\nLedger-Version: 3", ``},
		{"ledger.in.w.1.3.task", strings.Replace(valid, "Ledger-Generation: 1", "Ledger-Generation: 99999999999999999999", 1), ``},
		{"ledger.in.w.1.3.task", strings.Replace(valid, "Ledger-Version: 2", "Ledger-Version: -2", 1), ``},
		{"ledger.in.w.1.3.task", valid + "\nX-Pad: " + strings.Repeat("x", 9000), ``},
		{"ledger.in.w.1.3.task", strings.Repeat("X-A: 1\n", 70) + valid, ``},
		{"ledger.in.w.1.03.task", valid, ``},
		{"ledger.in.w.1.3", valid, ``},
		{"ledger.in.w.1.3.task", "", `{}`},
		{"ledger.in.w.1.3.task", valid + "\nLedger-Verdict: committed", `1e131071`},
		{"ledger.in.w.1.3.task", valid + "\nLedger-Holder: w.1", `{}`},
		{"ledger.in.w.1.3.task", valid + "\nLedger-Holder: v.1", `{}`},
		{"ledger.in.w.1.3.task", valid + "\nLedger-Kind: snapshot", `{"t":1}`},
		{"ledger.in.w.1.3.task", valid + "\nLedger-Kind: Snapshot", `{}`},
		{"ledger.in.w.1.3.task", valid + "\nLedger-Kind: events\nLedger-Kind: snapshot", `{}`},
	} {
		f.Add(c.subject, c.header, []byte(c.data))
	}
	subjects := wire.Subjects{}
	reasons := map[string]bool{}
	for _, r := range []string{wire.ReasonBadSubject, wire.ReasonHeadersTooLarge, wire.ReasonMissingEventID,
		wire.ReasonHolderMismatch, wire.ReasonMissingType, wire.ReasonMissingGen, wire.ReasonBadGeneration,
		wire.ReasonMissingVersion, wire.ReasonBadVersion, wire.ReasonRepeatedHeader, wire.ReasonBadEventID, wire.ReasonBadKind} {
		reasons[r] = true
	}
	f.Fuzz(func(t *testing.T, subject, header string, data []byte) {
		h := headerFrom(header)
		d, bad := subjects.DecodeInbound(subject, h, data)
		if bad != nil {
			if !reasons[bad.Reason] || bad.Detail == "" {
				t.Fatalf("not a contract invalid reason: %+v", bad)
			}
			return
		}
		holder, p, task, err := subjects.ParseIn(subject)
		if err != nil || holder != d.Holder || p != d.Partition || task != d.Task || !d.SubjectOK {
			t.Fatalf("event (%q, %d, %q) does not match subject %q", d.Holder, d.Partition, d.Task, subject)
		}
		if hs := h.Values(wire.HeaderHolder); len(hs) > 0 && hs[0] != holder {
			t.Fatalf("Ledger-Holder %q accepted on %q", hs[0], subject)
		}
		if d.HeaderBytes > wire.MaxHeaderBytes {
			t.Fatalf("%d header bytes accepted", d.HeaderBytes)
		}
		if d.ID != wire.EventIDOf(h.Get(wire.HeaderMsgID)) || d.Type != h.Get(wire.HeaderType) {
			t.Fatalf("event %+v does not match headers %v", d.Inbound, h)
		}
		if k := h.Values(wire.HeaderKind); (len(k) == 0 && d.Kind != wire.KindEvents) || (len(k) == 1 && d.Kind != k[0]) {
			t.Fatalf("kind %q from Ledger-Kind %q", d.Kind, k)
		}
		if d.Generation < 0 || d.Version < 0 || string(d.Payload) != string(data) {
			t.Fatalf("event %+v", d.Inbound)
		}
		// What was decoded is what the encoder makes of it again.
		m := subjects.InboundMsg(d.Inbound)
		again, bad := subjects.DecodeInbound(m.Subject, m.Header, m.Data)
		if bad != nil || again.Inbound.ID != d.ID || again.Version != d.Version || again.Generation != d.Generation ||
			again.Kind != d.Kind {
			t.Fatalf("re-encoded event decodes as %+v, %v", again.Inbound, bad)
		}
	})
}
