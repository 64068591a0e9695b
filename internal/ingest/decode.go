package ingest

import (
	"fmt"

	"github.com/nats-io/nats.go"

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
	// sourceSeq is the message's sequence in LEDGER_IN.
	sourceSeq uint64
	delivered uint64
}

// decode reads what the fence cannot see (the subject and the headers) into
// an event. It returns an invalid result for a message that cannot become an
// event at all; everything else (ids, types, payload, partition range) is
// checked by fence.Append, so the rules live in one place.
func decode(in *inbound, subjects wire.Subjects) (ok bool) {
	m := in.msg
	invalid := func(reason, detail string) bool {
		in.result = fence.Result{Verdict: wire.VerdictInvalid, Reason: reason, Detail: detail}
		return false
	}
	p, task, err := subjects.ParseIn(m.Subject())
	if err != nil {
		return invalid(wire.ReasonBadSubject, err.Error())
	}
	in.subjectOK = true
	in.event.Partition, in.event.Task = p, task
	h := m.Headers()

	id, reason, detail := header(h, wire.HeaderMsgID, wire.ReasonMissingEventID)
	in.event.ID = id
	holder, r2, d2 := header(h, wire.HeaderHolder, wire.ReasonMissingHolder)
	in.event.Holder = holder
	typ, r3, d3 := header(h, wire.HeaderType, wire.ReasonMissingType)
	in.event.Type = typ
	gen, r4, d4 := number(h, wire.HeaderGeneration, wire.ReasonMissingGen, wire.ReasonBadGeneration)
	in.event.Generation = gen
	ver, r5, d5 := number(h, wire.HeaderVersion, wire.ReasonMissingVersion, wire.ReasonBadVersion)
	in.event.Version = ver
	for _, c := range [][2]string{{reason, detail}, {r2, d2}, {r3, d3}, {r4, d4}, {r5, d5}} {
		if c[0] != "" {
			return invalid(c[0], c[1])
		}
	}
	in.event.Payload = m.Data()
	return true
}

// header returns the single value of a required header.
func header(h nats.Header, name, missing string) (string, string, string) {
	vals := h.Values(name)
	switch {
	case len(vals) == 0 || vals[0] == "":
		return "", missing, fmt.Sprintf("header %s is required", name)
	case len(vals) > 1:
		return vals[0], wire.ReasonDuplicateHeaders, fmt.Sprintf("header %s is given %d times", name, len(vals))
	}
	return vals[0], "", ""
}

// number returns a required header as a decimal integer.
func number(h nats.Header, name, missing, bad string) (int64, string, string) {
	s, reason, detail := header(h, name, missing)
	if reason != "" {
		return 0, reason, detail
	}
	n, err := wire.ParseInt(s)
	if err != nil {
		return 0, bad, fmt.Sprintf("header %s: %v", name, err)
	}
	return n, "", ""
}
