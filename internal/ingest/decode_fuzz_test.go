package ingest

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

// FuzzDecodeEvent: the inbound decoder never panics; it either gives an
// event whose fields are exactly what the subject and headers say, or an
// invalid verdict with a contract reason and a detail.
func FuzzDecodeEvent(f *testing.F) {
	valid := "Nats-Msg-Id: 01J00000000000000000000000\nLedger-Holder: w\nLedger-Generation: 1\nLedger-Version: 2\nLedger-Type: step"
	for _, c := range []struct{ subject, header, data string }{
		{"ledger.in.3.task", valid, `{"a":1}`},
		{"ledger.in.3.task", valid + "\nLedger-Version: 3", ``},
		{"ledger.in.3.task", strings.Replace(valid, "Ledger-Generation: 1", "Ledger-Generation: 99999999999999999999", 1), ``},
		{"ledger.in.3.task", strings.Replace(valid, "Ledger-Version: 2", "Ledger-Version: -2", 1), ``},
		{"ledger.in.3.task", valid + "\nX-Pad: " + strings.Repeat("x", 9000), ``},
		{"ledger.in.3.task", strings.Repeat("X-A: 1\n", 70) + valid, ``},
		{"ledger.in.03.task", valid, ``},
		{"ledger.in.3", valid, ``},
		{"ledger.in.3.task", "", `{}`},
		{"ledger.in.3.task", valid + "\nLedger-Verdict: committed", `1e131071`},
	} {
		f.Add(c.subject, c.header, []byte(c.data))
	}
	subjects := wire.Subjects{}
	reasons := map[string]bool{}
	for _, r := range []string{wire.ReasonBadSubject, wire.ReasonHeadersTooLarge, wire.ReasonMissingEventID,
		wire.ReasonMissingHolder, wire.ReasonMissingType, wire.ReasonMissingGen, wire.ReasonBadGeneration,
		wire.ReasonMissingVersion, wire.ReasonBadVersion, wire.ReasonDuplicateHeaders} {
		reasons[r] = true
	}
	f.Fuzz(func(t *testing.T, subject, header string, data []byte) {
		h := headerFrom(header)
		d := decodeEvent(subjects, subject, h, data)
		if !d.ok {
			if d.result.Verdict != wire.VerdictInvalid || !reasons[d.result.Reason] || d.result.Detail == "" {
				t.Fatalf("not a contract invalid verdict: %+v", d.result)
			}
			return
		}
		p, task, err := subjects.ParseIn(subject)
		if err != nil || p != d.event.Partition || task != d.event.Task {
			t.Fatalf("event (%d, %q) does not match subject %q", d.event.Partition, d.event.Task, subject)
		}
		if d.headerBytes > wire.MaxHeaderBytes {
			t.Fatalf("%d header bytes accepted", d.headerBytes)
		}
		if d.event.ID != h.Get(wire.HeaderMsgID) || d.event.Holder != h.Get(wire.HeaderHolder) || d.event.Type != h.Get(wire.HeaderType) {
			t.Fatalf("event %+v does not match headers %v", d.event, h)
		}
		if d.event.Generation < 0 || d.event.Version < 0 || string(d.event.Payload) != string(data) {
			t.Fatalf("event %+v", d.event)
		}
	})
}
