package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// The batch body is read by a scanner rather than by encoding/json's
// reflection, which cost about 4 µs an event (issue 28). An event's keys
// are read strictly, as the lease service reads request bodies: each one of
// the six names, spelled exactly (after its escapes are undone), at most
// once. encoding/json would fold case and keep the last of repeated keys,
// so one body could name two events. A version is a JSON number or null; a
// null leaves a field absent. Any value is checked as JSON, and nesting is
// limited to 10,000 levels. FuzzDecodeBatchMatchesReference holds it to the
// reflection decoder plus a strict key check.

// scannedBatch is a batch's body as the scanner read it. The string fields
// of all its events share one string: a few allocations for the batch.
type scannedBatch struct {
	elems []batchElem
	text  string
}

// batchElem is one event of a batch's body.
type batchElem struct {
	// text are the places of its string fields in the batch's text, by
	// field: fieldEventID..fieldKind. A version is the JSON number as
	// written.
	text [fieldKind]textSpan
	// Payload is the JSON value as written, a slice of the body, "null"
	// for null.
	Payload []byte
}

// textSpan is a string's place in scannedBatch.text.
type textSpan struct{ at, end int }

// value is the string field f of event i.
func (b *scannedBatch) value(i, f int) string {
	sp := b.elems[i].text[f-1]
	return b.text[sp.at:sp.end]
}

// maxJSONDepth is encoding/json's limit on nested arrays and objects.
const maxJSONDepth = 10000

// batchScanner reads a batch body, data. text collects the string fields'
// values, one after another.
type batchScanner struct {
	data []byte
	i    int
	text strings.Builder
}

// scanBatch reads data as a JSON array of event objects (or null). It keeps
// at most limit elements, but counts and checks them all: n is their count.
func scanBatch(data []byte, limit int) (b scannedBatch, n int, err error) {
	sc := batchScanner{data: data}
	sc.text.Grow(48 * limit) // an id, a task, a version and a type
	sc.ws()
	if sc.literal("null") {
		return b, 0, sc.end()
	}
	if !sc.next('[') {
		return b, 0, sc.fail("a JSON array")
	}
	elems := make([]batchElem, 0, limit)
	sc.ws()
	if sc.next(']') {
		return b, 0, sc.end()
	}
	for {
		var e batchElem
		sc.ws()
		switch {
		case sc.next('{'):
			if err := sc.object(&e, n); err != nil {
				return b, n, err
			}
		case !sc.literal("null"):
			return b, n, sc.fail("an event object")
		}
		if n < limit {
			elems = append(elems, e)
		}
		n++
		sc.ws()
		if sc.next(']') {
			if err := sc.end(); err != nil {
				return b, n, err
			}
			return scannedBatch{elems: elems, text: sc.text.String()}, n, nil
		}
		if !sc.next(',') {
			return b, n, sc.fail("',' or ']'")
		}
	}
}

// setText makes v the value of e's string field f.
func (sc *batchScanner) setText(e *batchElem, f int, v []byte) {
	e.text[f-1] = textSpan{sc.text.Len(), sc.text.Len() + len(v)}
	sc.text.Write(v)
}

// batchRuleError is an element that is JSON but breaks the batch's
// strict rules: its Error is the bad_batch detail as it stands.
type batchRuleError struct{ detail string }

func (e *batchRuleError) Error() string { return e.detail }

// object reads the rest of event n's object, after its '{', into e.
func (sc *batchScanner) object(e *batchElem, n int) error {
	var seen [fieldPayload + 1]bool
	sc.ws()
	if sc.next('}') {
		return nil
	}
	for {
		sc.ws()
		if !sc.next('"') {
			return sc.fail("a key")
		}
		key, plain, err := sc.str()
		if err != nil {
			return err
		}
		sc.ws()
		if !sc.next(':') {
			return sc.fail("':'")
		}
		sc.ws()
		f, name, err := sc.fieldOf(key, plain)
		if err != nil {
			return err
		}
		if f == fieldUnknown || seen[f] {
			// The pair must be JSON first: a body that is not is refused as such.
			if err := sc.skip(2); err != nil {
				return err
			}
			if f == fieldUnknown {
				return &batchRuleError{fmt.Sprintf("event %d: key %.40q is not one of %s", n, name, batchFieldList)}
			}
			return &batchRuleError{fmt.Sprintf("event %d: key %q repeated", n, name)}
		}
		seen[f] = true
		if err := sc.field(e, f, n); err != nil {
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

// Fields of an event object.
const (
	fieldUnknown = iota
	fieldEventID
	fieldTask
	fieldVersion
	fieldType
	fieldKind
	fieldPayload
)

var batchFieldNames = [...]string{
	fieldEventID: "event_id", fieldTask: "task", fieldVersion: "version",
	fieldType: "type", fieldKind: "kind", fieldPayload: "payload",
}

// batchFieldList names an event's keys in the detail that refuses another.
const batchFieldList = "event_id, task, version, type, kind, payload"

// fieldOf is the field a key names exactly, after its escapes are undone,
// and the key's name; fieldUnknown for any other key.
func (sc *batchScanner) fieldOf(key [2]int, plain bool) (int, string, error) {
	raw := sc.data[key[0]:key[1]]
	if !plain {
		var err error
		if raw, err = sc.unquote(key); err != nil {
			return fieldUnknown, "", err
		}
	}
	switch string(raw) {
	case "event_id":
		return fieldEventID, "event_id", nil
	case "task":
		return fieldTask, "task", nil
	case "version":
		return fieldVersion, "version", nil
	case "type":
		return fieldType, "type", nil
	case "kind":
		return fieldKind, "kind", nil
	case "payload":
		return fieldPayload, "payload", nil
	}
	return fieldUnknown, string(raw), nil
}

// field reads the value of event n's field f into e.
func (sc *batchScanner) field(e *batchElem, f, n int) error {
	start := sc.i
	if f == fieldPayload {
		if err := sc.skip(2); err != nil {
			return err
		}
		e.Payload = sc.data[start:sc.i]
		return nil
	}
	if sc.literal("null") {
		return nil // absent
	}
	if f == fieldVersion {
		if sc.i >= len(sc.data) || sc.data[sc.i] != '-' && !isDigit(sc.data[sc.i]) {
			if err := sc.skip(2); err != nil {
				return err
			}
			return &batchRuleError{fmt.Sprintf("event %d: version is not a JSON number", n)}
		}
		if !sc.number() {
			return sc.fail("a number")
		}
		sc.setText(e, fieldVersion, sc.data[start:sc.i])
		return nil
	}
	if !sc.next('"') {
		return sc.fail("a string for " + batchFieldNames[f])
	}
	v, err := sc.strValue()
	if err != nil {
		return err
	}
	sc.setText(e, f, v)
	return nil
}

// str reads the rest of a string, after its opening quote: span is its
// content. plain means it has no escape and is valid UTF-8, so the content
// is the value as written.
func (sc *batchScanner) str() (span [2]int, plain bool, err error) {
	start, ascii, escaped := sc.i, true, false
	for {
		for len(sc.data)-sc.i >= 8 && !anyStrSpecial(binary.LittleEndian.Uint64(sc.data[sc.i:])) {
			sc.i += 8
		}
		for sc.i < len(sc.data) && !strSpecial[sc.data[sc.i]] {
			sc.i++
		}
		if sc.i >= len(sc.data) {
			break
		}
		c := sc.data[sc.i]
		switch {
		case c == '"':
			span = [2]int{start, sc.i}
			sc.i++
			plain = !escaped && (ascii || utf8.Valid(sc.data[span[0]:span[1]]))
			return span, plain, nil
		case c < 0x20:
			return span, false, sc.fail("no control character in a string")
		case c >= utf8.RuneSelf:
			ascii = false
		case c == '\\':
			escaped = true
			sc.i++
			if sc.i >= len(sc.data) {
				return span, false, sc.fail("an escape")
			}
			switch sc.data[sc.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for range 4 {
					sc.i++
					if sc.i >= len(sc.data) || !isHex(sc.data[sc.i]) {
						return span, false, sc.fail("a \\u escape")
					}
				}
			default:
				return span, false, sc.fail("an escape")
			}
		}
		sc.i++
	}
	return span, false, sc.fail("'\"'")
}

// anyStrSpecial reports whether any of the eight bytes of x is one that
// strSpecial marks: most of a payload's strings are plain ASCII, which str
// then skips eight bytes at a time. Each test is the "has a byte less
// than n" word trick, exact for whether there is one.
func anyStrSpecial(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	quote, backslash := x^(ones*'"'), x^(ones*'\\')
	control := (x - ones*0x20) &^ x
	return (control|(quote-ones)&^quote|(backslash-ones)&^backslash|x)&highs != 0
}

// strSpecial marks the bytes str looks at: the others just go on a string.
var strSpecial = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf
	}
	return t
}()

// unquote is the value of a string that is not plain, with its escapes
// undone and invalid UTF-8 replaced, exactly as encoding/json does it.
// Such strings are rare, so encoding/json itself undoes them.
func (sc *batchScanner) unquote(span [2]int) ([]byte, error) {
	var v string
	err := json.Unmarshal(sc.data[span[0]-1:span[1]+1], &v)
	return []byte(v), err
}

// strValue reads the rest of a string, after its opening quote, and
// returns its value: the bytes as written when plain, else unquoted.
func (sc *batchScanner) strValue() ([]byte, error) {
	span, plain, err := sc.str()
	if err != nil || plain {
		return sc.data[span[0]:span[1]], err
	}
	return sc.unquote(span)
}

// skip reads one JSON value at nesting depth; the array and the event
// object around a payload are its first two levels.
func (sc *batchScanner) skip(depth int) error {
	if sc.i >= len(sc.data) {
		return sc.fail("a value")
	}
	switch c := sc.data[sc.i]; {
	case c == '"':
		sc.i++
		_, _, err := sc.str()
		return err
	case c == '{' || c == '[':
		if depth++; depth > maxJSONDepth {
			return fmt.Errorf("nested deeper than %d levels", maxJSONDepth)
		}
		sc.i++
		return sc.container(c, depth)
	case c == '-' || isDigit(c):
		if !sc.number() {
			return sc.fail("a number")
		}
		return nil
	case sc.literal("true") || sc.literal("false") || sc.literal("null"):
		return nil
	}
	return sc.fail("a value")
}

// container reads the rest of an object or array, after its open.
func (sc *batchScanner) container(open byte, depth int) error {
	closer := byte(']')
	if open == '{' {
		closer = '}'
	}
	sc.ws()
	if sc.next(closer) {
		return nil
	}
	for {
		sc.ws()
		if open == '{' {
			if !sc.next('"') {
				return sc.fail("a key")
			}
			if _, _, err := sc.str(); err != nil {
				return err
			}
			sc.ws()
			if !sc.next(':') {
				return sc.fail("':'")
			}
			sc.ws()
		}
		if err := sc.skip(depth); err != nil {
			return err
		}
		sc.ws()
		if sc.next(closer) {
			return nil
		}
		if !sc.next(',') {
			return sc.fail("',' or '" + string(closer) + "'")
		}
	}
}

// number reads a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (sc *batchScanner) number() bool {
	n := numberLen(sc.data[sc.i:])
	sc.i += n
	return n > 0
}

// numberLen is the length of the JSON number that starts b, 0 if none does.
func numberLen[T string | []byte](b T) int {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	default:
		return 0
	}
	if i < len(b) && b[i] == '.' {
		if i++; i >= len(b) || !isDigit(b[i]) {
			return 0
		}
		for ; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		if i++; i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return 0
		}
		for ; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	return i
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// ws skips JSON whitespace.
func (sc *batchScanner) ws() {
	for sc.i < len(sc.data) {
		switch sc.data[sc.i] {
		case ' ', '\t', '\n', '\r':
			sc.i++
		default:
			return
		}
	}
}

// next consumes c if it is the next byte.
func (sc *batchScanner) next(c byte) bool {
	if sc.i < len(sc.data) && sc.data[sc.i] == c {
		sc.i++
		return true
	}
	return false
}

// literal consumes lit if it comes next.
func (sc *batchScanner) literal(lit string) bool {
	if len(sc.data)-sc.i >= len(lit) && string(sc.data[sc.i:sc.i+len(lit)]) == lit {
		sc.i += len(lit)
		return true
	}
	return false
}

// end checks that nothing but whitespace follows the array.
func (sc *batchScanner) end() error {
	sc.ws()
	if sc.i < len(sc.data) {
		return sc.fail("the end of the body")
	}
	return nil
}

// fail says what the scanner expected where it stopped.
func (sc *batchScanner) fail(want string) error {
	if sc.i >= len(sc.data) {
		return fmt.Errorf("expected %s at offset %d, the end", want, sc.i)
	}
	return fmt.Errorf("expected %s at offset %d, found %q", want, sc.i, sc.data[sc.i])
}
