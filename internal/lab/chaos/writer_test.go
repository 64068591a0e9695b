package chaos

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowness/ledger/pkg/wire"
)

// FuzzDecodeReply: lease service replies of any content are decoded
// without a panic, and an error reply always has an error code.
func FuzzDecodeReply(f *testing.F) {
	f.Add("", []byte(`{"partition":3,"holder":"a","generation":42,"expires_at":"2026-01-02T03:04:05Z","ttl_ms":1000}`))
	f.Add("409", []byte(`{"error":"held","message":"held by b","holder":"b","generation":7,"expires_at":"x"}`))
	f.Add("503", []byte(`not json`))
	f.Add("", []byte(`[1,2,3]`))
	f.Fuzz(func(t *testing.T, code string, data []byte) {
		h := nats.Header{}
		if code != "" {
			h.Set(micro.ErrorCodeHeader, code)
		}
		var rep wire.LeaseReply
		er, err := decodeReply(h, data, &rep)
		if (er == nil) != (err == nil) {
			t.Fatalf("error reply %v with error %v", er, err)
		}
		if er != nil && er.Error == "" {
			t.Fatalf("error reply without a code: %+v", er)
		}
	})
}
