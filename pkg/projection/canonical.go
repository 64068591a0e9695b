package projection

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// fingerprint identifies the content (type and payload) of an event: two
// independently seeded 64-bit hashes of its canonical form. The seeds are
// random per Engine, so nobody can craft colliding payloads, and the 128 bits
// make an accidental collision between a conflicting copy and the applied one
// negligible. Fingerprints never leave the process, so they need not be stable
// across runs.
type fingerprint [2]uint64

// errBadJSON is returned by the canonicalizer for input that is not JSON.
var errBadJSON = errors.New("payload is not valid JSON")

// canonicalizer rewrites a JSON value into a canonical byte form in which two
// values are equal exactly when they mean the same JSON: objects have their
// members sorted by key with later duplicates winning (as Postgres jsonb and
// encoding/json keep the last), strings have escapes decoded and re-encoded
// minimally, numbers are compared by value (1, 1.0 and 1e0 are equal, as in
// jsonb), and insignificant whitespace is gone. This matters because the same
// committed event reaches the projector twice in different spellings: once as
// published on LEDGER_LOG and once re-fetched from a jsonb column.
//
// Its buffers are reused between calls; an Engine owns one and is not safe
// for concurrent use, so neither is this.
type canonicalizer struct {
	buf     []byte
	scratch []byte
	spans   []span
	seeds   [2]maphash.Seed
}

// span locates one canonical object member inside canonicalizer.buf:
// key = buf[start:colon] (quotes included), value = buf[colon+1:end]. pre
// holds the first 8 bytes of the key's text, big-endian and zero-padded, so
// that most comparisons while sorting are one integer compare. Canonical
// keys never contain a zero byte (it is escaped), so the padding sorts
// before any real byte and prefix order agrees with byte order.
type span struct {
	start, colon, end int
	pre               uint64
}

// keyPrefix computes span.pre from a key's text.
func keyPrefix(text []byte) uint64 {
	if len(text) >= 8 {
		return binary.BigEndian.Uint64(text)
	}
	var p uint64
	for k := 0; k < 8; k++ {
		p <<= 8
		if k < len(text) {
			p |= uint64(text[k])
		}
	}
	return p
}

// compareKeys orders two members by key text (quotes excluded, so that a
// key sorts before its extensions) in the buffer b that holds both.
func compareKeys(b []byte, x, y span) int {
	if x.pre != y.pre {
		if x.pre < y.pre {
			return -1
		}
		return 1
	}
	return bytes.Compare(b[x.start+1:x.colon-1], b[y.start+1:y.colon-1])
}

func newCanonicalizer() *canonicalizer {
	return &canonicalizer{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
}

// fingerprint returns the fingerprint of an event's type and payload, or
// errBadJSON when the payload is not a single valid JSON value.
func (c *canonicalizer) fingerprint(typ string, payload []byte) (fingerprint, error) {
	// The length prefix keeps type and payload from running into each other.
	c.buf = binary.AppendUvarint(c.buf[:0], uint64(len(typ)))
	c.buf = append(c.buf, typ...)
	if err := c.canonical(payload); err != nil {
		return fingerprint{}, err
	}
	fp := fingerprint{maphash.Bytes(c.seeds[0], c.buf), maphash.Bytes(c.seeds[1], c.buf)}
	// A one-off huge payload should not pin its buffers for the Engine's life.
	const keepMax = 1 << 20
	if cap(c.buf) > keepMax {
		c.buf = nil
	}
	if cap(c.scratch) > keepMax {
		c.scratch = nil
	}
	return fp, nil
}

// canonical appends the canonical form of the single JSON value in b to c.buf.
func (c *canonicalizer) canonical(b []byte) error {
	i, err := c.value(b, skipSpace(b, 0), 0)
	if err != nil {
		return err
	}
	if skipSpace(b, i) != len(b) {
		return errBadJSON
	}
	return nil
}

// maxDepth bounds nesting so that hostile input cannot exhaust the stack.
// It matches encoding/json's limit.
const maxDepth = 10000

// value appends the canonical form of the value starting at b[i] and returns
// the index just past it.
func (c *canonicalizer) value(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return 0, errBadJSON
	}
	switch b[i] {
	case '{':
		if depth >= maxDepth {
			return 0, errBadJSON
		}
		return c.object(b, i, depth+1)
	case '[':
		if depth >= maxDepth {
			return 0, errBadJSON
		}
		return c.array(b, i, depth+1)
	case '"':
		var err error
		c.buf, i, err = appendCanonicalString(c.buf, b, i)
		return i, err
	case 't':
		return c.literal(b, i, "true")
	case 'f':
		return c.literal(b, i, "false")
	case 'n':
		return c.literal(b, i, "null")
	default:
		var err error
		c.buf, i, err = appendCanonicalNumber(c.buf, b, i)
		return i, err
	}
}

func (c *canonicalizer) literal(b []byte, i int, lit string) (int, error) {
	if !bytes.HasPrefix(b[i:], []byte(lit)) {
		return 0, errBadJSON
	}
	c.buf = append(c.buf, lit...)
	return i + len(lit), nil
}

func (c *canonicalizer) array(b []byte, i, depth int) (int, error) {
	c.buf = append(c.buf, '[')
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		c.buf = append(c.buf, ']')
		return i + 1, nil
	}
	for {
		var err error
		if i, err = c.value(b, i, depth); err != nil {
			return 0, err
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return 0, errBadJSON
		}
		switch b[i] {
		case ',':
			c.buf = append(c.buf, ',')
			i = skipSpace(b, i+1)
		case ']':
			c.buf = append(c.buf, ']')
			return i + 1, nil
		default:
			return 0, errBadJSON
		}
	}
}

func (c *canonicalizer) object(b []byte, i, depth int) (int, error) {
	c.buf = append(c.buf, '{')
	base, start := len(c.spans), len(c.buf)
	defer func() { c.spans = c.spans[:base] }()
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		c.buf = append(c.buf, '}')
		return i + 1, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return 0, errBadJSON
		}
		var err error
		s := span{start: len(c.buf)}
		if c.buf, i, err = appendCanonicalString(c.buf, b, i); err != nil {
			return 0, err
		}
		s.colon = len(c.buf)
		s.pre = keyPrefix(c.buf[s.start+1 : s.colon-1])
		if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
			return 0, errBadJSON
		}
		c.buf = append(c.buf, ':')
		if i, err = c.value(b, skipSpace(b, i+1), depth); err != nil {
			return 0, err
		}
		s.end = len(c.buf)
		c.spans = append(c.spans, s)
		if i = skipSpace(b, i); i >= len(b) {
			return 0, errBadJSON
		}
		switch b[i] {
		case ',':
			c.buf = append(c.buf, ',')
			i = skipSpace(b, i+1)
		case '}':
			c.sortMembers(start, c.spans[base:])
			c.buf = append(c.buf, '}')
			return i + 1, nil
		default:
			return 0, errBadJSON
		}
	}
}

// sortMembers rewrites the members written since start in key order, keeping
// only the last of equal keys. Most objects need no rewrite: the check is a
// single pass.
func (c *canonicalizer) sortMembers(start int, ms []span) {
	sorted := true
	for k := 1; k < len(ms) && sorted; k++ {
		sorted = compareKeys(c.buf, ms[k-1], ms[k]) < 0
	}
	if sorted {
		return
	}
	// Move the members aside, then write them back in order. Nested objects
	// have finished with scratch by now, so one buffer serves every level.
	c.scratch = append(c.scratch[:0], c.buf[start:]...)
	for k := range ms {
		ms[k].start -= start
		ms[k].colon -= start
		ms[k].end -= start
	}
	if len(ms) <= 12 {
		// Insertion sort: stable, and without the indirect calls of the
		// generic sort, which cost more than the sorting on payload-sized
		// objects.
		for k := 1; k < len(ms); k++ {
			for j := k; j > 0 && compareKeys(c.scratch, ms[j-1], ms[j]) > 0; j-- {
				ms[j-1], ms[j] = ms[j], ms[j-1]
			}
		}
	} else {
		slices.SortStableFunc(ms, func(x, y span) int { return compareKeys(c.scratch, x, y) })
	}
	c.buf = c.buf[:start]
	for k, s := range ms {
		if k+1 < len(ms) && compareKeys(c.scratch, s, ms[k+1]) == 0 {
			continue // a later duplicate wins
		}
		if len(c.buf) > start {
			c.buf = append(c.buf, ',')
		}
		c.buf = append(c.buf, c.scratch[s.start:s.end]...)
	}
}

// appendCanonicalString appends the canonical encoding of the JSON string at
// b[i] == '"' to dst and returns the index just past it. Strings without
// escapes are already canonical and are copied as they are.
func appendCanonicalString(dst, b []byte, i int) ([]byte, int, error) {
	j := i + 1
	for ; j < len(b); j++ {
		c := b[j]
		if c == '"' {
			return append(dst, b[i:j+1]...), j + 1, nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return dst, 0, errBadJSON
		}
	}
	if j >= len(b) {
		return dst, 0, errBadJSON
	}
	dst = append(dst, b[i:j]...) // the opening quote and the plain prefix
	for j < len(b) {
		c := b[j]
		switch {
		case c == '"':
			return append(dst, '"'), j + 1, nil
		case c < 0x20:
			return dst, 0, errBadJSON
		case c != '\\':
			dst = append(dst, c)
			j++
			continue
		}
		if j+1 >= len(b) {
			return dst, 0, errBadJSON
		}
		j += 2
		switch b[j-1] {
		case '"', '\\', '/':
			dst = appendCanonicalRune(dst, rune(b[j-1]))
		case 'b':
			dst = appendCanonicalRune(dst, '\b')
		case 'f':
			dst = appendCanonicalRune(dst, '\f')
		case 'n':
			dst = appendCanonicalRune(dst, '\n')
		case 'r':
			dst = appendCanonicalRune(dst, '\r')
		case 't':
			dst = appendCanonicalRune(dst, '\t')
		case 'u':
			r, ok := hex4(b, j)
			if !ok {
				return dst, 0, errBadJSON
			}
			j += 4
			if utf16.IsSurrogate(r) {
				// A valid pair is one character; a lone half becomes U+FFFD,
				// as encoding/json decodes it.
				r2, ok := rune(-1), false
				if j+1 < len(b) && b[j] == '\\' && b[j+1] == 'u' {
					r2, ok = hex4(b, j+2)
				}
				if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
					r = dec
					j += 6
				} else {
					r = utf8.RuneError
				}
			}
			dst = appendCanonicalRune(dst, r)
		default:
			return dst, 0, errBadJSON
		}
	}
	return dst, 0, errBadJSON
}

// appendCanonicalRune appends r as it appears in a canonical string: escaped
// only when JSON requires it.
func appendCanonicalRune(dst []byte, r rune) []byte {
	const hex = "0123456789abcdef"
	switch {
	case r == '"' || r == '\\':
		return append(dst, '\\', byte(r))
	case r < 0x20:
		return append(dst, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
	default:
		return utf8.AppendRune(dst, r)
	}
}

// hex4 decodes the four hex digits at b[i:i+4].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// appendCanonicalNumber appends the canonical form of the JSON number at b[i]
// and returns the index just past it. The form is the value's significant
// digits and a decimal exponent ("-15e-1" for -1.50), so that spellings of one
// value compare equal; zero is "0" whatever its sign.
func appendCanonicalNumber(dst, b []byte, i int) ([]byte, int, error) {
	j := i
	neg := j < len(b) && b[j] == '-'
	if neg {
		j++
	}
	intStart := j
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && '1' <= b[j] && b[j] <= '9':
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			j++
		}
	default:
		return dst, 0, errBadJSON
	}
	intEnd, fracStart, fracEnd := j, j, j
	if j < len(b) && b[j] == '.' {
		j++
		fracStart = j
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			j++
		}
		if j == fracStart {
			return dst, 0, errBadJSON
		}
		fracEnd = j
	}
	var exp int64
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		expNeg := false
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			expNeg = b[j] == '-'
			j++
		}
		expStart := j
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			if exp < 1<<40 { // saturate: such exponents only need to stay distinct
				exp = exp*10 + int64(b[j]-'0')
			}
			j++
		}
		if j == expStart {
			return dst, 0, errBadJSON
		}
		if expNeg {
			exp = -exp
		}
	}
	// Significant digits: integer and fraction digits without leading and
	// trailing zeros; each dropped trailing zero raises the exponent.
	digits := func(k int) byte {
		if k < intEnd-intStart {
			return b[intStart+k]
		}
		return b[fracStart+k-(intEnd-intStart)]
	}
	n := intEnd - intStart + fracEnd - fracStart
	lo, hi := 0, n
	for lo < hi && digits(lo) == '0' {
		lo++
	}
	for hi > lo && digits(hi-1) == '0' {
		hi--
	}
	if lo == hi {
		return append(dst, '0'), j, nil
	}
	exp += int64(n-hi) - int64(fracEnd-fracStart)
	if neg {
		dst = append(dst, '-')
	}
	for k := lo; k < hi; k++ {
		dst = append(dst, digits(k))
	}
	dst = append(dst, 'e')
	dst = appendInt(dst, exp)
	return dst, j, nil
}

func appendInt(dst []byte, v int64) []byte {
	if v < 0 {
		dst = append(dst, '-')
		v = -v
	}
	var tmp [20]byte
	k := len(tmp)
	for {
		k--
		tmp[k] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return append(dst, tmp[k:]...)
}
