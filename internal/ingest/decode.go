package ingest

import (
	"time"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// inbound is one LEDGER_IN message on its way to a verdict.
type inbound struct {
	msg    jsMsg
	event  fence.Event
	result fence.Result
	// subjectOK is false when the subject itself is unusable; the dead
	// letter then goes to <prefix>.dlq.invalid.
	subjectOK bool
	// stream is the inbox stream that stored the message, sourceSeq its
	// sequence there, delivered its delivery count, published the time
	// JetStream stored it.
	stream    string
	sourceSeq uint64
	delivered uint64
	published time.Time
	// received is when this process was handed the message; queued is
	// set once its wait before its first batch is counted (metrics.go).
	received time.Time
	queued   bool
	// part is the partition whose consumer delivered the message: the
	// claim it is decided under, whatever its subject says.
	part int
	// parkedAt is when it was first parked to wait for an earlier
	// version, and retryAt when it is offered again if nothing moves its
	// task's head before; zero while it is not parked.
	parkedAt, retryAt time.Time
	// bad is set on a batch message that does not decode (batch.go).
	bad *badBatch
}

// decode reads the message into in's event (wire.DecodeInbound), or gives
// in its invalid verdict.
func decode(in *inbound, subjects wire.Subjects) (ok bool) {
	if in.bad != nil {
		decodeBad(in)
		return false
	}
	m := in.msg
	d, bad := subjects.DecodeInbound(m.Subject(), m.Headers(), m.Data())
	in.subjectOK = d.SubjectOK
	in.event = fence.Event{ID: d.ID, Partition: d.Partition, Task: d.Task, Version: d.Version, Type: d.Type,
		Payload: d.Payload, Holder: d.Holder, Generation: d.Generation, Snapshot: d.Kind == wire.KindSnapshot}
	if bad != nil {
		in.result = fence.Result{Verdict: wire.VerdictInvalid, Reason: bad.Reason, Detail: bad.Detail}
		return false
	}
	return true
}
