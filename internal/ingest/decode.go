package ingest

import (
	"fmt"
	"time"

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
	// headerBytes is the size of the message's headers as NATS sends them.
	headerBytes int
	// sourceSeq is the message's sequence in LEDGER_IN, delivered its
	// delivery count, published the time JetStream stored it.
	sourceSeq uint64
	delivered uint64
	published time.Time
	// received is when this process was handed the message.
	received time.Time
}

// decode reads what the fence cannot see (the subject and the headers) into
// in's event, or gives in an invalid result.
func decode(in *inbound, subjects wire.Subjects) (ok bool) {
	m := in.msg
	d := decodeEvent(subjects, m.Subject(), m.Headers(), m.Data())
	in.event, in.subjectOK, in.headerBytes = d.event, d.subjectOK, d.headerBytes
	if !d.ok {
		in.result = d.result
	}
	return d.ok
}

// decoded is what decodeEvent makes of one message.
type decoded struct {
	event       fence.Event
	result      fence.Result // the invalid verdict when !ok
	subjectOK   bool
	headerBytes int
	ok          bool
}

// decodeEvent turns a message into an event, or an invalid result for a
// message that cannot become an event at all. Everything the fence checks
// (ids, types, payload, partition range) is left to fence.Append, so the
// rules live in one place; this checks the subject and the headers.
func decodeEvent(subjects wire.Subjects, subject string, h nats.Header, data []byte) (d decoded) {
	invalid := func(reason, detail string) decoded {
		d.result = fence.Result{Verdict: wire.VerdictInvalid, Reason: reason, Detail: detail}
		return d
	}
	values := 0
	d.headerBytes, values = headerSize(h)
	p, task, err := subjects.ParseIn(subject)
	if err != nil {
		return invalid(wire.ReasonBadSubject, err.Error())
	}
	d.subjectOK = true
	d.event.Partition, d.event.Task = p, task

	id, reason, detail := header(h, wire.HeaderMsgID, wire.ReasonMissingEventID)
	d.event.ID = id
	holder, r2, d2 := header(h, wire.HeaderHolder, wire.ReasonMissingHolder)
	d.event.Holder = holder
	typ, r3, d3 := header(h, wire.HeaderType, wire.ReasonMissingType)
	d.event.Type = typ
	gen, r4, d4 := number(h, wire.HeaderGeneration, wire.ReasonMissingGen, wire.ReasonBadGeneration)
	d.event.Generation = gen
	ver, r5, d5 := number(h, wire.HeaderVersion, wire.ReasonMissingVersion, wire.ReasonBadVersion)
	d.event.Version = ver
	// The ids are read first so that even this verdict reaches its holder.
	if d.headerBytes > wire.MaxHeaderBytes || values > wire.MaxHeaderValues {
		return invalid(wire.ReasonHeadersTooLarge, fmt.Sprintf("headers are %d bytes in %d values; at most %d bytes and %d values are allowed",
			d.headerBytes, values, wire.MaxHeaderBytes, wire.MaxHeaderValues))
	}
	for _, c := range [][2]string{{reason, detail}, {r2, d2}, {r3, d3}, {r4, d4}, {r5, d5}} {
		if c[0] != "" {
			return invalid(c[0], c[1])
		}
	}
	d.event.Payload = data
	d.ok = true
	return d
}

// headerSize is the size of h as NATS frames it ("NATS/1.0\r\n", a
// "Name: value\r\n" line per value, a blank line), and its value count.
func headerSize(h nats.Header) (bytes, values int) {
	if len(h) == 0 {
		return 0, 0
	}
	bytes = len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			bytes += len(k) + len(": \r\n") + len(v)
			values++
		}
	}
	return bytes, values
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
