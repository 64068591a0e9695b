package wire_test

import (
	"testing"

	"github.com/flowness/ledger/pkg/wire"
)

// FuzzDecodeBatch: the batch decoder never panics. A batch it accepts has
// exactly Ledger-Batch events, each the single-event message of the
// subject's holder and partition under its own id; one it refuses is
// bad_batch, and every id it names for a receipt is a valid event id.
func FuzzDecodeBatch(f *testing.F) {
	hdr := "Nats-Msg-Id: batch-01J00000000000000000000000:ab\nLedger-Generation: 1\nLedger-Batch: "
	one := `{"event_id":"01J00000000000000000000000","task":"t","version":1,"type":"x","payload":{"a":1}}`
	two := `{"event_id":"01J00000000000000000000001","task":"t","version":2,"type":"x","kind":"snapshot"}`
	for _, c := range []struct{ subject, header, data string }{
		{"ledger.in.w.1.3", hdr + "1", "[" + one + "]"},
		{"ledger.in.w.1.3", hdr + "2", "[" + one + "," + two + "]"},
		{"ledger.in.w.1.3", hdr + "2", "[" + one + "]"},
		{"ledger.in.w.1.03", hdr + "1", "[" + one + "]"},
		{"ledger.in.w.1.3", hdr + "1", one},
		{"ledger.in.w.1.3", hdr + "1", `[{"event_id":"01J00000000000000000000000","task":"a.b","version":"1"}]`},
		{"ledger.in.w.1.3", hdr + "1\nLedger-Batch: 1", "[" + one + "]"},
		{"ledger.in.w.3", hdr + "1", "[" + one + "]"},
	} {
		f.Add(c.subject, c.header, []byte(c.data))
	}
	subjects := wire.Subjects{}
	f.Fuzz(func(t *testing.T, subject, header string, data []byte) {
		h := headerFrom(header)
		d, bad := subjects.DecodeBatch(subject, h, data)
		if bad != nil {
			if bad.Reason != wire.ReasonBadBatch || bad.Detail == "" || d.Events != nil {
				t.Fatalf("refused batch: %+v, %d events", bad, len(d.Events))
			}
			for _, id := range d.IDs {
				if !wire.ValidEventID(id) {
					t.Fatalf("receipt id %q is not an event id", id)
				}
			}
			return
		}
		holder, p, err := subjects.ParseInBatch(subject)
		if err != nil || holder != d.Holder || p != d.Partition {
			t.Fatalf("batch (%q, %d) does not match subject %q", d.Holder, d.Partition, subject)
		}
		if n := h.Get(wire.HeaderBatch); n == "" || len(d.Events) < 1 || len(d.Events) > wire.MaxBatch {
			t.Fatalf("%d events accepted under Ledger-Batch %q", len(d.Events), n)
		}
		for _, em := range d.Events {
			e, _ := subjects.DecodeInbound(em.Subject, em.Header, em.Data)
			if e.Holder != holder || !wire.ValidEventID(e.ID) || em.Header.Get(wire.HeaderBatch) != "" {
				t.Fatalf("event %+v of batch on %q", e.Inbound, subject)
			}
			if e.SubjectOK && e.Partition != p {
				t.Fatalf("event of partition %d in a batch of %d", e.Partition, p)
			}
		}
	})
}
