package projection

import "unicode/utf8"

// Small byte-level JSON scanners shared by the merge patch and the content
// fingerprint. They exist because decoding every payload into map[string]any
// and encoding it again costs several microseconds per event, which is most of
// the budget of the apply path. The scanners that the merge patch uses assume
// valid JSON (the caller checks it first); the canonicalizer validates as it
// goes.

var nullJSON = []byte("null")

// isSpace reports whether c is JSON insignificant whitespace.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

// skipSpace returns the index of the first non-whitespace byte of b at or
// after i, or len(b).
func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// trimSpace returns b without leading and trailing JSON whitespace.
func trimSpace(b []byte) []byte {
	i := skipSpace(b, 0)
	j := len(b)
	for j > i && isSpace(b[j-1]) {
		j--
	}
	return b[i:j]
}

// isObject reports whether the JSON value b (already trimmed) is an object.
func isObject(b []byte) bool { return len(b) > 0 && b[0] == '{' }

// isNull reports whether the JSON value b (already trimmed) is null.
func isNull(b []byte) bool { return len(b) == 4 && string(b) == "null" }

// scanString returns the index just past the closing quote of the string that
// starts at b[i] == '"'. It assumes valid JSON.
func scanString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++ // the escaped byte cannot close the string
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// scanValue returns the index just past the JSON value that starts at b[i]
// (not whitespace). It assumes valid JSON.
func scanValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return scanString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = scanString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	default: // number or literal
		for i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
			i++
		}
		return i
	}
}

// scanKey is scanString that also reports whether the key must be decoded
// before it is compared: it has escapes ("a" is "\u0061"), or bytes that are
// not UTF-8 (a decoder reads each as U+FFFD).
func scanKey(b []byte, i int) (int, bool) {
	esc, high := false, false
	s := i
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '\\':
			esc = true
			i++
		case c == '"':
			return i + 1, esc || high && !utf8.Valid(b[s:i+1])
		case c >= utf8.RuneSelf:
			high = true
		}
	}
	return len(b), esc
}
