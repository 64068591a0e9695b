package projection

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

// member is one name/value pair of a JSON object: key is the raw string token
// including its quotes, val the raw value without surrounding whitespace. A nil
// val marks a member removed by a merge patch, and touched one that the patch
// has set or removed. esc records that the key has escapes, so that it must
// be decoded before comparing ("a" is "\u0061").
type member struct {
	key     []byte
	val     []byte
	esc     bool
	touched bool
}

// scanKey is scanString that also reports whether the string has escapes.
func scanKey(b []byte, i int) (int, bool) {
	esc := false
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			esc = true
			i++
		case '"':
			return i + 1, esc
		}
	}
	return len(b), esc
}

// appendMembers appends the members of the JSON object obj (trimmed, valid) to
// ms in document order.
func appendMembers(ms []member, obj []byte) []member {
	i := 1 // past '{'
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] == '}' {
			return ms
		}
		if obj[i] == ',' {
			i++
			continue
		}
		ks := i
		var esc bool
		i, esc = scanKey(obj, i)
		key := obj[ks:i]
		i = skipSpace(obj, i) + 1 // past ':'
		i = skipSpace(obj, i)
		vs := i
		i = scanValue(obj, i)
		ms = append(ms, member{key: key, val: obj[vs:i], esc: esc})
	}
}
