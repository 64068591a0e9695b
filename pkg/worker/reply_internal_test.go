package worker

import (
	"errors"
	"testing"

	"github.com/flowness/ledger/pkg/wire"
)

// FuzzLeaseServiceReply feeds any reply of the lease service (body, and the
// micro error code and message headers) to the decoding an acquire, a
// lease.get poll and the partition count lookup share: it never panics, an
// error reply is a *ServiceError matching exactly one outcome, and the
// partition count it yields is usable or an error.
func FuzzLeaseServiceReply(f *testing.F) {
	for _, seed := range []struct{ code, msg, body string }{
		{"", "", `{"partition":0,"holder":"reports.pod-a","generation":4,"expires_at":"2026-03-01T12:00:00.123456789Z","ttl_ms":3000,"valid":true,"partitions":16}`},
		{"", "", `{"partition":3,"holder":"reports.pod-a","generation":42,"expires_at":"2026-03-01T12:00:00Z","ttl_ms":3000}`},
		{"404", "partition 0 was never leased", `{"error":"no_lease","message":"partition 0 was never leased","partitions":7}`},
		{"409", "held", `{"error":"held","message":"held","holder":"reports.pod-b","generation":9,"expires_at":"2026-03-01T12:00:03.5Z"}`},
		{"409", "held", `{"error":"held","expires_at":"not a time"}`},
		{"503", "the ledger's database could not serve the request", `{"error":"unavailable","message":"retry"}`},
		{"429", "over its rate", `{"error":"rate_limited","message":"retry later"}`},
		{"429", "too many at once", `{"error":"busy","message":"retry later"}`},
		{"400", "bad", `not json`},
		{"418", "teapot", `{"error":"teapot"}`},
		{"", "", `{"partitions":-1}`},
		{"", "", `{"partitions":99999999999}`},
		{"", "", `{"partitions":1e400}`},
		{"", "", `{"generation":"9"}`},
		{"", "", ``},
		{"", "", `null`},
	} {
		f.Add(seed.code, seed.msg, []byte(seed.body))
	}
	outcomes := []error{ErrHeld, ErrLost, ErrNoLease, ErrInvalid, ErrUnavailable}
	f.Fuzz(func(t *testing.T, code, msg string, body []byte) {
		var reply wire.LeaseReply
		err := decodeReply(code, msg, body, &reply)
		var se *ServiceError
		if code != "" {
			if !errors.As(err, &se) {
				t.Fatalf("error reply %q %q decoded as %v", code, body, err)
			}
			matched := 0
			for _, o := range outcomes {
				if errors.Is(err, o) {
					matched++
				}
			}
			if matched != 1 {
				t.Fatalf("service error %+v matches %d outcomes", se, matched)
			}
		}
		n, perr := partitionsFrom(reply, err)
		switch {
		case perr == nil && (n < 1 || n > 1<<31-1):
			t.Fatalf("partition count %d accepted", n)
		case perr == nil && err != nil && !errors.Is(err, ErrNoLease):
			t.Fatalf("partition count %d taken from the failed reply %v", n, err)
		case perr == nil:
			_ = wire.PartitionOf("task", n) // must not panic
		}
	})
}

// A principal over its share of the lease service is told so, and the SDK
// takes it as "unavailable for now": every loop that retries an
// unavailable service backs off and tries again.
func TestBusyAndRateLimitedAreRetriedLikeUnavailable(t *testing.T) {
	t.Parallel()
	for _, code := range []string{wire.ErrCodeBusy, wire.ErrCodeRateLimited} {
		err := decodeReply("429", "retry later", []byte(`{"error":"`+code+`","message":"retry later"}`), &wire.LeaseReply{})
		if !errors.Is(err, ErrBusy) || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s: %v is not ErrBusy and ErrUnavailable", code, err)
		}
		for _, o := range []error{ErrHeld, ErrLost, ErrNoLease, ErrInvalid} {
			if errors.Is(err, o) {
				t.Fatalf("%s: %v matches %v", code, err, o)
			}
		}
	}
}
