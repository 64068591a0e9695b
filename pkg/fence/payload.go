package fence

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

var jsonNull = []byte("null")

// normalizePayload returns the payload to store (an empty body is JSON null)
// or why it cannot be stored. Beyond JSON syntax it refuses what PostgreSQL's
// jsonb would refuse, so that one bad event is invalid on its own instead of
// failing its whole batch: invalid UTF-8, the \u0000 escape, unpaired
// surrogates, and nesting deeper than MaxPayloadDepth.
func normalizePayload(p []byte, max int) ([]byte, error) {
	if len(p) == 0 {
		return jsonNull, nil
	}
	if len(p) > max {
		return nil, fmt.Errorf("payload is %d bytes, more than the %d allowed", len(p), max)
	}
	if !utf8.Valid(p) {
		return nil, fmt.Errorf("payload is not valid UTF-8")
	}
	if !json.Valid(p) {
		return nil, fmt.Errorf("payload is not valid JSON")
	}
	if err := checkJSONForPostgres(p); err != nil {
		return nil, err
	}
	return p, nil
}

// checkJSONForPostgres scans syntactically valid JSON for nesting depth and
// for the string escapes jsonb rejects.
func checkJSONForPostgres(p []byte) error {
	depth := 0
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '[', '{':
			depth++
			if depth > MaxPayloadDepth {
				return fmt.Errorf("payload nests deeper than %d levels", MaxPayloadDepth)
			}
		case ']', '}':
			depth--
		case '"':
			end, err := checkString(p, i+1)
			if err != nil {
				return err
			}
			i = end
		}
	}
	return nil
}

// checkString walks a JSON string that starts at p[i] (after the quote) and
// returns the index of its closing quote.
func checkString(p []byte, i int) (int, error) {
	pendingHigh := false
	for ; i < len(p); i++ {
		c := p[i]
		if c == '"' {
			if pendingHigh {
				return 0, fmt.Errorf("payload has an unpaired UTF-16 surrogate escape")
			}
			return i, nil
		}
		if c != '\\' {
			if pendingHigh {
				return 0, fmt.Errorf("payload has an unpaired UTF-16 surrogate escape")
			}
			continue
		}
		i++
		if p[i] != 'u' {
			if pendingHigh {
				return 0, fmt.Errorf("payload has an unpaired UTF-16 surrogate escape")
			}
			continue
		}
		var r rune
		for _, h := range p[i+1 : i+5] {
			r = r<<4 | rune(hexVal(h))
		}
		i += 4
		switch {
		case r == 0:
			return 0, fmt.Errorf(`payload has a \u0000 escape, which PostgreSQL cannot store`)
		case r >= 0xD800 && r <= 0xDBFF:
			if pendingHigh {
				return 0, fmt.Errorf("payload has an unpaired UTF-16 surrogate escape")
			}
			pendingHigh = true
		case r >= 0xDC00 && r <= 0xDFFF:
			if !pendingHigh {
				return 0, fmt.Errorf("payload has an unpaired UTF-16 surrogate escape")
			}
			pendingHigh = false
		default:
			if pendingHigh {
				return 0, fmt.Errorf("payload has an unpaired UTF-16 surrogate escape")
			}
		}
	}
	return i, nil
}

func hexVal(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}
