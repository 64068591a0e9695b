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
		"ledger.in.3.report-7", "ledger.log.0.a", "ledger.dlq.15.x_y", "ledger.dlq.invalid",
		"ledger.in.003.t", "ledger.in.-1.t", "ledger.in.+1.t", "ledger.in.3.a.b", "ledger.in.3.",
		"ledger.in..t", "ledger.in.99999999999999999999.t", "ledger.in.1073741825.t", "ledger.in.3.\x00",
		"ledger.in.3.ü", "ledger.in.3.a*", "ledger.in.3.>", "other.in.3.t",
	} {
		f.Add(s)
	}
	subjects := wire.Subjects{}
	f.Fuzz(func(t *testing.T, subject string) {
		for _, k := range []struct {
			parse func(string) (int, string, error)
			build func(int, string) string
		}{
			{subjects.ParseIn, subjects.In},
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
