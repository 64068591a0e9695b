package wire

import (
	"fmt"
	"math"
)

// A log batch's body is read with the scanner of LEDGER_IN batches
// (batchscan.go) rather than encoding/json's reflection, which cost 3.6 µs
// an event (BenchmarkDecodeLog). Its keys are read strictly: each one of
// the eleven names, spelled exactly, at most once. encoding/json would fold
// case and keep the last of repeated keys. FuzzLogBatchScannerMatchesJSON
// holds it to encoding/json where both accept a body.

// Fields of a log batch's event object.
const (
	logFieldUnknown = iota
	logFieldSeq
	logFieldEventID
	logFieldTask
	logFieldVersion
	logFieldType
	logFieldHolder
	logFieldGeneration
	logFieldCommittedAt
	logFieldPayload
	logFieldKind
	logFieldWouldReject
	logFieldCount
)

var logFieldNames = [logFieldCount]string{
	logFieldSeq: "seq", logFieldEventID: "event_id", logFieldTask: "task", logFieldVersion: "version",
	logFieldType: "type", logFieldHolder: "holder", logFieldGeneration: "generation",
	logFieldCommittedAt: "committed_at", logFieldPayload: "payload", logFieldKind: "kind",
	logFieldWouldReject: "would_reject",
}

// logFieldOf is the field a key's name is; logFieldUnknown for any other.
func logFieldOf(name []byte) int {
	switch string(name) { // no allocation: the compiler compares the bytes
	case "seq":
		return logFieldSeq
	case "event_id":
		return logFieldEventID
	case "task":
		return logFieldTask
	case "version":
		return logFieldVersion
	case "type":
		return logFieldType
	case "holder":
		return logFieldHolder
	case "generation":
		return logFieldGeneration
	case "committed_at":
		return logFieldCommittedAt
	case "payload":
		return logFieldPayload
	case "kind":
		return logFieldKind
	case "would_reject":
		return logFieldWouldReject
	}
	return logFieldUnknown
}

// scanLogBatch reads data as a JSON array of log batch events.
func scanLogBatch(data []byte) ([]logBatchElem, error) {
	sc := batchScanner{data: data}
	sc.ws()
	if !sc.next('[') {
		return nil, sc.fail("a JSON array")
	}
	var elems []logBatchElem
	sc.ws()
	if sc.next(']') {
		return elems, sc.end()
	}
	for n := 0; ; n++ {
		sc.ws()
		if !sc.next('{') {
			return nil, sc.fail("an event object")
		}
		var e logBatchElem
		if err := scanLogElem(&sc, &e, n); err != nil {
			return nil, err
		}
		elems = append(elems, e)
		sc.ws()
		if sc.next(']') {
			return elems, sc.end()
		}
		if !sc.next(',') {
			return nil, sc.fail("',' or ']'")
		}
	}
}

// scanLogElem reads the rest of event n's object, after its '{', into e.
func scanLogElem(sc *batchScanner, e *logBatchElem, n int) error {
	var seen [logFieldCount]bool
	sc.ws()
	if sc.next('}') {
		return nil
	}
	for {
		sc.ws()
		if !sc.next('"') {
			return sc.fail("a key")
		}
		name, err := sc.strValue()
		if err != nil {
			return err
		}
		sc.ws()
		if !sc.next(':') {
			return sc.fail("':'")
		}
		sc.ws()
		f := logFieldOf(name)
		switch {
		case f == logFieldUnknown:
			return fmt.Errorf("event %d: unknown field %.40q", n, name)
		case seen[f]:
			return fmt.Errorf("event %d: key %q repeated", n, name)
		}
		seen[f] = true
		if err := scanLogField(sc, e, f, n); err != nil {
			return err
		}
		sc.ws()
		if sc.next('}') {
			return nil
		}
		if !sc.next(',') {
			return sc.fail("',' or '}'")
		}
	}
}

// scanLogField reads the value of event n's field f into e. null leaves a
// field absent, as encoding/json does, but a payload keeps it (the caller
// reads it as none).
func scanLogField(sc *batchScanner, e *logBatchElem, f, n int) error {
	start := sc.i
	if f == logFieldPayload {
		if err := sc.skip(2); err != nil {
			return err
		}
		e.Payload = sc.data[start:sc.i]
		return nil
	}
	if sc.literal("null") {
		return nil
	}
	switch f {
	case logFieldSeq, logFieldVersion, logFieldGeneration:
		if !sc.number() {
			return sc.fail("a number for " + logFieldNames[f])
		}
		v, ok := jsonInt(sc.data[start:sc.i])
		if !ok {
			return fmt.Errorf("event %d: %s %s is not an integer", n, logFieldNames[f], sc.data[start:sc.i])
		}
		switch f {
		case logFieldSeq:
			e.Seq = v
		case logFieldVersion:
			e.Version = v
		default:
			e.Generation = v
		}
		return nil
	}
	if !sc.next('"') {
		return sc.fail("a string for " + logFieldNames[f])
	}
	v, err := sc.strValue()
	if err != nil {
		return err
	}
	s := string(v)
	switch f {
	case logFieldEventID:
		e.EventID = s
	case logFieldTask:
		e.Task = s
	case logFieldType:
		e.Type = s
	case logFieldHolder:
		e.Holder = s
	case logFieldCommittedAt:
		e.CommittedAt = s
	case logFieldKind:
		e.Kind = s
	case logFieldWouldReject:
		e.WouldReject = s
	}
	return nil
}

// jsonInt is the value of a JSON number that is an int64 written without
// a fraction or an exponent, as encoding/json reads one into an int64.
func jsonInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 {
		return 0, false
	}
	var u uint64
	for _, c := range b {
		if !isDigit(c) {
			return 0, false // a fraction or an exponent
		}
		d := uint64(c - '0')
		if u > (math.MaxUint64-d)/10 {
			return 0, false
		}
		u = u*10 + d
	}
	switch {
	case neg && u <= 1<<63:
		return -int64(u-1) - 1, true
	case !neg && u <= math.MaxInt64:
		return int64(u), true
	}
	return 0, false
}
