// Package canonjson rewrites a JSON value into one canonical byte form, in
// which two values are equal exactly when PostgreSQL's jsonb calls them equal:
//
//   - objects have their members sorted by key, and of equal keys the last
//     one wins (as jsonb and encoding/json keep the last);
//   - strings have their escapes decoded and re-encoded minimally, so "\/"
//     and "/", or "\u00e9" and "é", are one string;
//   - numbers are compared by value: 1, 1.0, 10e-1 and 1e0 are one number,
//     and -0 is 0 (jsonb compares numerics by value, whatever their scale);
//   - insignificant whitespace is gone.
//
// The work is linear in the input, apart from the sorting of each object's
// members (n log n in the members of one object) and the moving of an
// unsorted object's bytes into key order, which touches a byte once per
// enclosing object that was out of order. Numbers cost what their digits
// cost, whatever their exponent: 1e131071 is six bytes of input and eight of
// output, never a bignum.
//
// Where jsonb refuses an input that JSON allows (a \u0000 escape, an
// unpaired UTF-16 surrogate), the canonical form follows encoding/json: the
// escape decodes to the character, a lone surrogate to U+FFFD. Callers that
// store jsonb refuse those inputs before comparing.
//
// The package imports nothing of the ledger's: the fence compares payloads by
// their canonical form, and the projection engine fingerprints it.
package canonjson

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrInvalid is returned for input that is not a single valid JSON value.
var ErrInvalid = errors.New("canonjson: not a valid JSON value")

// MaxDepth is the deepest nesting of arrays and objects accepted: 10000, as
// encoding/json. It keeps hostile input from exhausting the stack.
const MaxDepth = 10000

// Append appends the canonical form of the single JSON value in src (with
// optional surrounding whitespace) to dst, or returns ErrInvalid.
func Append(dst, src []byte) ([]byte, error) {
	var c Canonicalizer
	return c.Append(dst, src)
}

// Equal reports whether a and b are the same JSON value in the sense of
// jsonb equality. It returns ErrInvalid if either is not valid JSON.
func Equal(a, b []byte) (bool, error) {
	var c Canonicalizer
	ca, err := c.Append(nil, a)
	if err != nil {
		return false, err
	}
	cb, err := c.Append(nil, b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(ca, cb), nil
}

// A Canonicalizer is Append with buffers reused between calls. The zero
// value is ready to use. It is not safe for concurrent use.
type Canonicalizer struct {
	buf     []byte // dst, while a call runs
	scratch []byte
	spans   []span
	// work counts the bytes written and moved and the key comparisons made,
	// so that tests can check the cost without a clock.
	work int
}

// keepMax is the largest scratch buffer kept between calls: a one-off huge
// payload should not pin its buffers.
const keepMax = 1 << 20

// Append appends the canonical form of the single JSON value in src to dst,
// or returns ErrInvalid (and dst unchanged in length).
func (c *Canonicalizer) Append(dst, src []byte) ([]byte, error) {
	n := len(dst)
	c.buf = dst
	i, err := c.value(src, skipSpace(src, 0), 0)
	if err == nil && skipSpace(src, i) != len(src) {
		err = ErrInvalid
	}
	out := c.buf
	c.buf = nil
	c.spans = c.spans[:0]
	if cap(c.scratch) > keepMax {
		c.scratch = nil
	}
	if err != nil {
		return out[:n], err
	}
	return out, nil
}

// span locates one canonical object member inside the output buffer:
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
func (c *Canonicalizer) compareKeys(b []byte, x, y span) int {
	c.work++
	if x.pre != y.pre {
		if x.pre < y.pre {
			return -1
		}
		return 1
	}
	kx, ky := b[x.start+1:x.colon-1], b[y.start+1:y.colon-1]
	c.work += min(len(kx), len(ky))
	return bytes.Compare(kx, ky)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// value appends the canonical form of the value starting at b[i] and returns
// the index just past it.
func (c *Canonicalizer) value(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return 0, ErrInvalid
	}
	switch b[i] {
	case '{':
		if depth >= MaxDepth {
			return 0, ErrInvalid
		}
		return c.object(b, i, depth+1)
	case '[':
		if depth >= MaxDepth {
			return 0, ErrInvalid
		}
		return c.array(b, i, depth+1)
	case '"':
		n := len(c.buf)
		var err error
		c.buf, i, err = AppendString(c.buf, b, i)
		c.work += len(c.buf) - n
		return i, err
	case 't':
		return c.literal(b, i, "true")
	case 'f':
		return c.literal(b, i, "false")
	case 'n':
		return c.literal(b, i, "null")
	default:
		n := len(c.buf)
		var err error
		c.buf, i, err = appendNumber(c.buf, b, i)
		c.work += len(c.buf) - n
		return i, err
	}
}

func (c *Canonicalizer) literal(b []byte, i int, lit string) (int, error) {
	if !bytes.HasPrefix(b[i:], []byte(lit)) {
		return 0, ErrInvalid
	}
	c.buf = append(c.buf, lit...)
	c.work += len(lit)
	return i + len(lit), nil
}

func (c *Canonicalizer) array(b []byte, i, depth int) (int, error) {
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
			return 0, ErrInvalid
		}
		switch b[i] {
		case ',':
			c.buf = append(c.buf, ',')
			i = skipSpace(b, i+1)
		case ']':
			c.buf = append(c.buf, ']')
			return i + 1, nil
		default:
			return 0, ErrInvalid
		}
	}
}

func (c *Canonicalizer) object(b []byte, i, depth int) (int, error) {
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
			return 0, ErrInvalid
		}
		var err error
		s := span{start: len(c.buf)}
		if c.buf, i, err = AppendString(c.buf, b, i); err != nil {
			return 0, err
		}
		s.colon = len(c.buf)
		c.work += s.colon - s.start
		s.pre = keyPrefix(c.buf[s.start+1 : s.colon-1])
		if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
			return 0, ErrInvalid
		}
		c.buf = append(c.buf, ':')
		if i, err = c.value(b, skipSpace(b, i+1), depth); err != nil {
			return 0, err
		}
		s.end = len(c.buf)
		c.spans = append(c.spans, s)
		if i = skipSpace(b, i); i >= len(b) {
			return 0, ErrInvalid
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
			return 0, ErrInvalid
		}
	}
}

// sortMembers rewrites the members written since start in key order, keeping
// only the last of equal keys. Most objects need no rewrite: the check is a
// single pass.
func (c *Canonicalizer) sortMembers(start int, ms []span) {
	sorted := true
	for k := 1; k < len(ms) && sorted; k++ {
		sorted = c.compareKeys(c.buf, ms[k-1], ms[k]) < 0
	}
	if sorted {
		return
	}
	// Move the members aside, then write them back in order. Nested objects
	// have finished with scratch by now, so one buffer serves every level.
	c.scratch = append(c.scratch[:0], c.buf[start:]...)
	c.work += 2 * (len(c.buf) - start)
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
			for j := k; j > 0 && c.compareKeys(c.scratch, ms[j-1], ms[j]) > 0; j-- {
				ms[j-1], ms[j] = ms[j], ms[j-1]
			}
		}
	} else {
		slices.SortStableFunc(ms, func(x, y span) int { return c.compareKeys(c.scratch, x, y) })
	}
	c.buf = c.buf[:start]
	for k, s := range ms {
		if k+1 < len(ms) && c.compareKeys(c.scratch, s, ms[k+1]) == 0 {
			continue // a later duplicate wins
		}
		if len(c.buf) > start {
			c.buf = append(c.buf, ',')
		}
		c.buf = append(c.buf, c.scratch[s.start:s.end]...)
	}
}

// AppendString appends the canonical encoding of the JSON string token at
// b[i] == '"' to dst and returns the index just past it. Strings without
// escapes are already canonical and are copied as they are.
func AppendString(dst, b []byte, i int) ([]byte, int, error) {
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
			return dst, 0, ErrInvalid
		}
	}
	if j >= len(b) {
		return dst, 0, ErrInvalid
	}
	dst = append(dst, b[i:j]...) // the opening quote and the plain prefix
	for j < len(b) {
		c := b[j]
		switch {
		case c == '"':
			return append(dst, '"'), j + 1, nil
		case c < 0x20:
			return dst, 0, ErrInvalid
		case c != '\\':
			dst = append(dst, c)
			j++
			continue
		}
		if j+1 >= len(b) {
			return dst, 0, ErrInvalid
		}
		j += 2
		switch b[j-1] {
		case '"', '\\', '/':
			dst = appendRune(dst, rune(b[j-1]))
		case 'b':
			dst = appendRune(dst, '\b')
		case 'f':
			dst = appendRune(dst, '\f')
		case 'n':
			dst = appendRune(dst, '\n')
		case 'r':
			dst = appendRune(dst, '\r')
		case 't':
			dst = appendRune(dst, '\t')
		case 'u':
			r, ok := hex4(b, j)
			if !ok {
				return dst, 0, ErrInvalid
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
			dst = appendRune(dst, r)
		default:
			return dst, 0, ErrInvalid
		}
	}
	return dst, 0, ErrInvalid
}

// appendRune appends r as it appears in a canonical string: escaped only
// when JSON requires it.
func appendRune(dst []byte, r rune) []byte {
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
