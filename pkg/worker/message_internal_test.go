package worker

import (
	"reflect"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/wire"
)

// An event's own LEDGER_IN message is built when first asked for, once, by
// whichever goroutine asks first (a failed batch, a re-send, a reconnect),
// and it is the message InboundMsg makes of the event as send gave it.
//
// Switch: a plain nil check instead of msgOnce; the race detector reports
// the concurrent builds, and the callers get different messages.
func TestEventsOwnMessageIsBuiltOnceWhenFirstNeeded(t *testing.T) {
	l := &Lease{c: &Client{subj: wire.Subjects{}}, partition: 2, generation: 3}
	p := &Pending{lease: l, id: "01JD0000000000000000000001", task: "job"}
	if m := p.message(); m != nil {
		t.Fatalf("an event not sent yet has a message: %+v", m)
	}
	p.version = 7
	p.in = wire.Inbound{ID: p.id, Partition: 2, Task: "job", Holder: "reports.pod-a", Generation: 3,
		Version: 7, Type: "progress", Payload: []byte(`{"step":1}`)}
	msgs := make([]*nats.Msg, 8)
	var wg sync.WaitGroup
	for i := range msgs {
		wg.Go(func() { msgs[i] = p.message() })
	}
	wg.Wait()
	for i, m := range msgs {
		if m != msgs[0] {
			t.Fatalf("caller %d got another message than caller 0", i)
		}
	}
	want := wire.Subjects{}.InboundMsg(p.in)
	if got := msgs[0]; got.Subject != want.Subject || !reflect.DeepEqual(got.Header, want.Header) ||
		string(got.Data) != string(want.Data) {
		t.Fatalf("message %+v, want %+v", got, want)
	}
}
