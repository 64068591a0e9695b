package ingest

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// FuzzRequesterOf feeds any Nats-Request-Info header and reply subject to
// the lookup that names whom a public read is charged to: it never
// panics, always names someone, and a holder in the subject always wins.
func FuzzRequesterOf(f *testing.F) {
	for _, seed := range []struct{ info, reply string }{
		{`{"acc":"LEDGER_WORKERS","user":"UABC","rtt":1000}`, "_R_.abc.def"},
		{`{"acc":"LEDGER_WORKERS"}`, "_R_.abc"},
		{"", "_INBOX.reports.x.y"},
		{"", "_INBOX."},
		{`{"user":1}`, "_INBOX..x"},
		{`not json`, ""},
	} {
		f.Add(seed.info, seed.reply)
	}
	f.Fuzz(func(t *testing.T, info, reply string) {
		h := nats.Header{}
		h.Set("Nats-Request-Info", info)
		who := requesterOf("", h, reply)
		if who == "" {
			t.Fatalf("no one named for %q %q", info, reply)
		}
		if strings.HasPrefix(reply, "_INBOX.") && strings.HasPrefix(who, "account:") {
			t.Fatalf("an inbox requester %q charged to its account %q", reply, who)
		}
		if got := requesterOf("reports.a", h, reply); got != "reports" {
			t.Fatalf("holder reports.a charged to %q", got)
		}
	})
}

// A read is charged to its sender: the user the server vouches for, else
// its inbox's principal, else its account, else "-".
func TestAReadIsChargedToItsSender(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ info, reply, want string }{
		{`{"acc":"LEDGER_WORKERS","user":"UABC"}`, "_R_.x", "user:UABC"},
		{`{"acc":"LEDGER_WORKERS"}`, "_R_.x", "account:LEDGER_WORKERS"},
		{"", "_INBOX.reports.x", "reports"},
		{"", "_INBOX_ledgerctl.x", "-"},
	} {
		h := nats.Header{}
		if c.info != "" {
			h.Set("Nats-Request-Info", c.info)
		}
		if got := requesterOf("", h, c.reply); got != c.want {
			t.Errorf("%q %q: charged to %q, want %q", c.info, c.reply, got, c.want)
		}
	}
}

// A principal's reads and acquires cannot use up what keeps its own leases:
// renewals and releases have a bucket and an in-flight count of their own.
// Switch: one bucket and one count per principal (fair.go, classes merged)
// refuses the renewal rate_limited.
func TestAPrincipalsReadsLeaveItsRenewalsTheirShare(t *testing.T) {
	q := newFairQueue(Config{LeaseRate: 0.001, LeaseBurst: 3, LeaseInFlight: 2, LeaseWorkers: 2, LeaseMaxAge: time.Minute})
	read := func() *fairJob {
		return &fairJob{principal: "bench", endpoint: "task.head", class: classOf("task.head")}
	}
	refused := 0
	for range 10 {
		if q.admit(read()) != "" {
			refused++
		}
	}
	if refused != 8 {
		t.Fatalf("reads: %d of 10 refused, want 8 (2 in flight)", refused)
	}
	for i := range 2 {
		renew := &fairJob{principal: "bench", endpoint: "renew", class: classOf("renew")}
		if why := q.admit(renew); why != "" {
			t.Fatalf("renewal %d refused %s after the principal's reads used up their share", i, why)
		}
	}
}
