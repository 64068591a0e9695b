package canonjson

// appendNumber appends the canonical form of the JSON number at b[i] and
// returns the index just past it. The form is the value's significant digits
// and a decimal exponent ("-15e-1" for -1.50), so that spellings of one value
// compare equal; zero is "0" whatever its sign, scale and exponent.
//
// The exponent is exact whatever its size: one of up to 18 digits is
// computed in an int64, a longer one by adding the small adjustment to its
// decimal digits, so 1e99999999999999999999 and 1e99999999999999999998
// differ, in time linear in the digits.
func appendNumber(dst, b []byte, i int) ([]byte, int, error) {
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
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	default:
		return dst, 0, ErrInvalid
	}
	intEnd, fracStart, fracEnd := j, j, j
	if j < len(b) && b[j] == '.' {
		j++
		fracStart = j
		for j < len(b) && isDigit(b[j]) {
			j++
		}
		if j == fracStart {
			return dst, 0, ErrInvalid
		}
		fracEnd = j
	}
	expNeg := false
	var expDigits []byte // the exponent's digits without leading zeros
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			expNeg = b[j] == '-'
			j++
		}
		expStart := j
		for j < len(b) && isDigit(b[j]) {
			j++
		}
		if j == expStart {
			return dst, 0, ErrInvalid
		}
		k := expStart
		for k < j-1 && b[k] == '0' {
			k++
		}
		expDigits = b[k:j]
	}
	// Significant digits: integer and fraction digits without leading and
	// trailing zeros; each dropped trailing zero raises the exponent.
	digit := func(k int) byte {
		if k < intEnd-intStart {
			return b[intStart+k]
		}
		return b[fracStart+k-(intEnd-intStart)]
	}
	n := intEnd - intStart + fracEnd - fracStart
	lo, hi := 0, n
	for lo < hi && digit(lo) == '0' {
		lo++
	}
	for hi > lo && digit(hi-1) == '0' {
		hi--
	}
	if lo == hi {
		return append(dst, '0'), j, nil
	}
	if neg {
		dst = append(dst, '-')
	}
	for k := lo; k < hi; k++ {
		dst = append(dst, digit(k))
	}
	dst = append(dst, 'e')
	adj := int64(n-hi) - int64(fracEnd-fracStart)
	return appendExponent(dst, expNeg, expDigits, adj), j, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// appendExponent appends the decimal value of ±digits + adj. digits has no
// leading zero (or is "0", or empty for no exponent).
func appendExponent(dst []byte, neg bool, digits []byte, adj int64) []byte {
	if len(digits) <= 18 {
		var e int64
		for _, d := range digits {
			e = e*10 + int64(d-'0')
		}
		if neg {
			e = -e
		}
		return appendInt(dst, e+adj)
	}
	// |±digits| >= 10^18 exceeds any adjustment (bounded by the input's
	// length), so the sign is the written one and only the magnitude moves.
	if neg {
		dst = append(dst, '-')
		adj = -adj
	}
	start := len(dst)
	dst = append(dst, digits...)
	m := dst[start:]
	if adj >= 0 {
		carry := uint64(adj)
		for k := len(m) - 1; k >= 0 && carry > 0; k-- {
			s := uint64(m[k]-'0') + carry%10
			carry /= 10
			if s >= 10 {
				s -= 10
				carry++
			}
			m[k] = byte('0' + s)
		}
		if carry > 0 {
			// Unreachable while adj < 10^18 <= the magnitude; kept exact anyway.
			head := appendInt(nil, int64(carry))
			dst = append(dst[:start], append(head, m...)...)
		}
		return dst
	}
	borrow := uint64(-adj)
	for k := len(m) - 1; k >= 0 && borrow > 0; k-- {
		d := int64(m[k]-'0') - int64(borrow%10)
		borrow /= 10
		if d < 0 {
			d += 10
			borrow++
		}
		m[k] = byte('0' + d)
	}
	// The magnitude stays positive; drop the leading zeros a borrow left.
	z := 0
	for z < len(m)-1 && m[z] == '0' {
		z++
	}
	if z > 0 {
		copy(m, m[z:])
		dst = dst[:len(dst)-z]
	}
	return dst
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
