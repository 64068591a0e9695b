package fence

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/flowness/ledger/pkg/wire"
)

var jsonNull = []byte("null")

// normalizePayload returns the payload to store (an empty body is JSON null)
// or why it cannot be stored. Beyond JSON syntax it refuses what PostgreSQL's
// jsonb would refuse, so that one bad event is invalid on its own instead of
// failing its whole batch: invalid UTF-8, the \u0000 escape, unpaired
// surrogates, and nesting deeper than MaxPayloadDepth. It also refuses
// numbers outside the bounds of checkNumber, which jsonb would store but
// render huge. It runs in time linear in the payload.
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
	if !wire.ValidJSON(p) {
		return nil, fmt.Errorf("payload is not valid JSON")
	}
	if err := checkJSONForPostgres(p); err != nil {
		return nil, err
	}
	return p, nil
}

// checkJSONForPostgres scans syntactically valid JSON for nesting depth, for
// the string escapes jsonb rejects and for numbers out of bounds.
func checkJSONForPostgres(p []byte) error {
	depth := 0
	growth := 0 // how much longer PostgreSQL renders the numbers than they are written
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			end, g, err := checkNumber(p, i)
			if err != nil {
				return err
			}
			if growth += g; growth > len(p)+MaxNumberGrowthSlack {
				return fmt.Errorf("payload's numbers would render %d bytes longer than written, more than its size plus %d",
					growth, MaxNumberGrowthSlack)
			}
			i = end - 1
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

// checkNumber checks the number that starts at p[i] (valid JSON) against the
// bounds PostgreSQL needs, and returns the index just past it and how many
// bytes longer than written numeric_out renders it (0 if not longer).
//
// jsonb stores a number as a numeric: 1e131071 takes a few bytes, but its
// text is 131072 digits, and a payload of them renders gigabytes (a re-read
// ran out of memory, SQLSTATE 54000). So a number may have at most
// MaxNumberDigits digits and an exponent within ±MaxNumberExponent; that
// also keeps every accepted number inside numeric's range (131072 digits
// before the point, 16383 after), so PostgreSQL never refuses one that
// passed here. And as a payload of many 1e1000 would still render a thousand
// times its size, the growth of all its numbers together is bounded too.
//
// The rendering of digits m (leading zeros dropped) with f fraction digits
// and exponent e is max(1, m+e-f) integer digits, then, when the scale
// f-e is positive, a point and f-e digits.
func checkNumber(p []byte, i int) (end, growth int, err error) {
	j := i
	neg := p[j] == '-'
	if neg {
		j++
	}
	digits, frac, lead, nonzero := 0, 0, 0, false
	digit := func() {
		if p[j] != '0' {
			nonzero = true
		} else if !nonzero {
			lead++
		}
		digits++
	}
	for ; j < len(p) && isDigit(p[j]); j++ {
		digit()
	}
	if j < len(p) && p[j] == '.' {
		for j++; j < len(p) && isDigit(p[j]); j++ {
			digit()
			frac++
		}
	}
	exp, expNeg := 0, false
	if j < len(p) && (p[j] == 'e' || p[j] == 'E') {
		j++
		if p[j] == '+' || p[j] == '-' {
			expNeg = p[j] == '-'
			j++
		}
		for ; j < len(p) && isDigit(p[j]); j++ {
			if exp <= MaxNumberExponent {
				exp = exp*10 + int(p[j]-'0')
			}
		}
	}
	if expNeg {
		exp = -exp
	}
	switch {
	case digits > MaxNumberDigits:
		return 0, 0, fmt.Errorf("payload has a number of %d digits, more than %d", digits, MaxNumberDigits)
	case exp > MaxNumberExponent || exp < -MaxNumberExponent:
		return 0, 0, fmt.Errorf("payload has a number with exponent %s, outside ±%d",
			strings.TrimLeft(string(p[i:j]), "-.0123456789"), MaxNumberExponent)
	}
	m := digits - lead
	rendered := max(1, m+exp-frac)
	if !nonzero {
		rendered = 1
	}
	if scale := frac - exp; scale > 0 {
		rendered += 1 + scale
	}
	if neg && nonzero { // zero renders unsigned
		rendered++
	}
	return j, max(0, rendered-(j-i)), nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

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
