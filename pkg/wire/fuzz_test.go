package wire_test

import (
	"testing"

	"github.com/flowness/ledger/pkg/wire"
)

// FuzzParseSubjects: the subject parsers never panic, and whatever they
// accept is exactly the subject the builders make of the parts, so every
// accepted subject has one spelling.
func FuzzParseSubjects(f *testing.F) {
	for _, s := range []string{
		"ledger.in.p.i.3.report-7", "ledger.log.0.a", "ledger.dlq.15.x_y", "ledger.dlq.invalid",
		"ledger.in.p.i.003.t", "ledger.in.p.i.-1.t", "ledger.in.p.i.+1.t", "ledger.in.p.i.3.a.b", "ledger.in.p.i.3.",
		"ledger.in.p.i..t", "ledger.in.p.i.99999999999999999999.t", "ledger.in.p.i.1073741825.t", "ledger.in.p.i.3.\x00",
		"ledger.in.p.i.3.ü", "ledger.in.p.i.3.a*", "ledger.in.p.i.3.>", "other.in.p.i.3.t", "ledger.in.p.3.t",
		"ledger.lease.acquire.p.i", "ledger.lease.renew.p.i.x", "ledger.lease.release.p",
	} {
		f.Add(s)
	}
	subjects := wire.Subjects{}
	f.Fuzz(func(t *testing.T, subject string) {
		if h, p, task, err := subjects.ParseIn(subject); err == nil {
			if !wire.ValidHolder(h) || p < 0 || !wire.ValidID(task) {
				t.Fatalf("%q parsed to (%q, %d, %q)", subject, h, p, task)
			}
			if again := subjects.In(h, p, task); again != subject {
				t.Fatalf("%q parsed to (%q, %d, %q), which builds %q", subject, h, p, task, again)
			}
		}
		for _, op := range []string{wire.LeaseAcquire, wire.LeaseRenew, wire.LeaseRelease} {
			if h, err := subjects.ParseLease(op, subject); err == nil && subjects.Lease(op, h) != subject {
				t.Fatalf("%q parsed to holder %q, which builds %q", subject, h, subjects.Lease(op, h))
			}
		}
		for _, k := range []struct {
			parse func(string) (int, string, error)
			build func(int, string) string
		}{
			{subjects.ParseLog, subjects.Log},
			{subjects.ParseDLQ, subjects.DLQ},
		} {
			p, task, err := k.parse(subject)
			if err != nil {
				continue
			}
			if p < 0 || !wire.ValidID(task) {
				t.Fatalf("%q parsed to partition %d, task %q", subject, p, task)
			}
			if again := k.build(p, task); again != subject {
				t.Fatalf("%q parsed to (%d, %q), which builds %q", subject, p, task, again)
			}
		}
	})
}
