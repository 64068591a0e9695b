package canonjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func canonical(t testing.TB, in string) string {
	t.Helper()
	out, err := Append(nil, []byte(in))
	require.NoError(t, err, in)
	return string(out)
}

func TestSpellingsOfOneValueHaveOneForm(t *testing.T) {
	t.Parallel()
	same := [][2]string{
		{`{"b":1,"a":2}`, ` { "a" : 2 , "b" : 1 } `},
		{`{"a":1,"a":2}`, `{"a":2}`},
		{`{"a":1,"b":0,"a":2}`, `{"b":0,"a":2}`},
		{`"\u00e9\/\n\"\\"`, "\"é/\\n\\\"\\\\\""},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\ud83d"`, `"\ufffd"`},
		{`[1, 1.0, 10e-1, 0.1e1, 100E-2, 1e0, 1E+0]`, `[1,1,1,1,1,1,1]`},
		{`[0, -0, 0.000, 0e10, -0.0e-7, 0e99999999999999999999999]`, `[0,0,0,0,0,0]`},
		{`[120, 1.2e2, 1200e-1]`, `[120,120,120]`},
		{`[-0.05]`, `[-5e-2]`},
		{`1e131071`, `1e131071`},
		{`10e131070`, `1e131071`},
		{`1e0000000000000000000000000000005`, `1e5`},
		{`100e99999999999999999998`, `1e100000000000000000000`},
		{`0.01e-99999999999999999999`, `1e-100000000000000000001`},
		{`1000e-1000000000000000000003`, `1e-1000000000000000000000`},
	}
	for _, p := range same {
		require.Equal(t, canonical(t, p[0]), canonical(t, p[1]), "%s ~ %s", p[0], p[1])
		eq, err := Equal([]byte(p[0]), []byte(p[1]))
		require.NoError(t, err)
		require.True(t, eq, "%s ~ %s", p[0], p[1])
	}
	different := [][2]string{
		{`{"a":1}`, `{"a":1,"b":null}`},
		{`[1,2]`, `[2,1]`},
		{`1`, `-1`},
		{`1`, `10`},
		{`0.1`, `1`},
		{`"1"`, `1`},
		{`null`, `"null"`},
		{`{"a":{"b":1}}`, `{"a":{"c":1}}`},
		{`{"ab":1}`, `{"a":1,"b":1}`},
		{`1e131071`, `1e131072`},
		// Exponents past int64 stay exact: they differ in the last digit.
		{`1e99999999999999999999`, `1e99999999999999999998`},
		{`1e-99999999999999999999`, `1e-99999999999999999998`},
		{`1.5e99999999999999999999`, `15e99999999999999999999`},
	}
	for _, p := range different {
		require.NotEqual(t, canonical(t, p[0]), canonical(t, p[1]), "%s !~ %s", p[0], p[1])
		eq, err := Equal([]byte(p[0]), []byte(p[1]))
		require.NoError(t, err)
		require.False(t, eq, "%s !~ %s", p[0], p[1])
	}
}

func TestHugeExponentArithmeticIsExact(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{`1e99999999999999999999`, `1e99999999999999999999`},
		{`100e99999999999999999999`, `1e100000000000000000001`},
		{`0.001e100000000000000000002`, `1e99999999999999999999`},
		{`-0.001e-100000000000000000002`, `-1e-100000000000000000005`},
		{`12.5e1000000000000000000`, `125e999999999999999999`},
		{`5e-1000000000000000000`, `5e-1000000000000000000`},
		{`123e9223372036854775807`, `123e9223372036854775807`},
		{`1230e9223372036854775807`, `123e9223372036854775808`},
	} {
		require.Equal(t, c.want, canonical(t, c.in), c.in)
	}
}

func TestInvalidInputIsRefused(t *testing.T) {
	t.Parallel()
	for _, in := range []string{``, ` `, `{`, `[1,]`, `{"a"}`, `01`, `1.`, `.5`, `1e`, `-`, `+1`, `"\x"`, `"a`,
		"\"\x01\"", `tru`, `nul`, `1 2`, `{"a":1}}`, `[` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth+1)} {
		_, err := Append(nil, []byte(in))
		require.ErrorIs(t, err, ErrInvalid, "%q", in)
	}
	dst := []byte("prefix")
	out, err := Append(dst, []byte(`{"a":[1,`))
	require.Error(t, err)
	require.Equal(t, "prefix", string(out), "a refused input leaves dst as it was")
}

// The adversarial payloads of the fence's equality check (long digit
// strings, huge exponents, 10^5-digit numbers) cost work linear in their
// size: the canonicalizer counts the bytes it writes and moves and the key
// comparisons it makes, so this needs no clock.
func TestWorkIsLinearInTheInput(t *testing.T) {
	t.Parallel()
	digits := func(n int) string { return strings.Repeat("7", n) }
	cases := map[string]func(n int) string{
		"one long number":      func(n int) string { return digits(n) },
		"long fraction":        func(n int) string { return "0." + digits(n) },
		"long exponent":        func(n int) string { return "1e" + digits(n) },
		"long negative exp":    func(n int) string { return "-1.5e-" + digits(n) },
		"trailing zeros":       func(n int) string { return "1" + strings.Repeat("0", n) + "e-" + digits(30) },
		"many huge exponents":  func(n int) string { return "[" + strings.Repeat("1e131071,", n/9) + "1]" },
		"many long numbers":    func(n int) string { return "[" + strings.Repeat(digits(99)+",", n/100) + "1]" },
		"object of numbers":    func(n int) string { return wideObject(n/20, "1e131071") },
		"escaped string":       func(n int) string { return `"` + strings.Repeat(`\u00e9\/`, n/8) + `"` },
		"reversed keys":        func(n int) string { return wideObject(n/20, "0.5") },
		"unsorted nested once": func(n int) string { return `{"z":` + wideObject(n/20, "1") + `,"a":1}` },
	}
	for name, gen := range cases {
		for _, n := range []int{1_000, 10_000, 100_000} {
			in := []byte(gen(n))
			var c Canonicalizer
			_, err := c.Append(nil, in)
			require.NoError(t, err, name)
			// Bytes are written once and moved at most twice; sorting adds
			// comparisons: 40 per byte is far below n log n at these sizes
			// for a quadratic or bignum algorithm, and far above the 2-6 per
			// byte these inputs need.
			require.LessOrEqual(t, c.work, 40*len(in)+100, "%s, %d bytes: work %d", name, len(in), c.work)
		}
	}
}

// wideObject is an object of n members in descending key order, so that
// sorting has to move every one.
func wideObject(n int, value string) string {
	var b strings.Builder
	b.WriteByte('{')
	for k := n; k > 0; k-- {
		if k < n {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%07d":%s`, k, value)
	}
	b.WriteByte('}')
	return b.String()
}

// Nested unsorted objects are the one input whose bytes move more than
// twice: once per enclosing object that is out of order, so the work is
// bounded by the input times the nesting depth.
func TestWorkOfNestedUnsortedObjectsIsBoundedByDepth(t *testing.T) {
	t.Parallel()
	for _, depth := range []int{10, 100, 512} {
		in := []byte(strings.Repeat(`{"z":`, depth) + `"` + strings.Repeat("x", 10_000) + `"` + strings.Repeat(`,"a":1}`, depth))
		var c Canonicalizer
		_, err := c.Append(nil, in)
		require.NoError(t, err)
		require.LessOrEqual(t, c.work, 4*len(in)*(depth+1), "depth %d", depth)
	}
}

// The canonical form is itself valid JSON, of the same value, and a fixed
// point.
func TestCanonicalFormIsAFixedPoint(t *testing.T) {
	t.Parallel()
	for _, in := range []string{`{"b":[1.50,{"y":"\u00e9","x":-0}],"a":"\ud83d\ude00"}`, `1e131071`, `-12.3400e-5`} {
		once := canonical(t, in)
		require.True(t, json.Valid([]byte(once)), once)
		require.Equal(t, once, canonical(t, once))
	}
}

func FuzzAppend(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1.0,-0,"\u00e9"]}`, `1e131071`, `"\u0000"`, `"\ud800"`, `[[[[]]]]`,
		strings.Repeat("9", 1000), `1e` + strings.Repeat("9", 40), `{"a":1,"a":2}`, `0.0e-0`, `-0.000e+99999999999999999999`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Append(nil, in)
		if json.Valid(in) != (err == nil) {
			t.Fatalf("json.Valid %v, canonjson error %v, for %q", json.Valid(in), err, in)
		}
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("canonical form %q of %q is not JSON", out, in)
		}
		again, err := Append(nil, out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("canonical form %q of %q is not a fixed point: %q, %v", out, in, again, err)
		}
	})
}

func BenchmarkEqualAdversarial(b *testing.B) {
	long := strings.Repeat("7", 100_000)
	for name, pair := range map[string][2]string{
		"huge_exponents_2.7KB":  {"[" + strings.Repeat("1e131071,", 300) + "1]", "[" + strings.Repeat("10e131070,", 300) + "1]"},
		"1e5_digit_numbers":     {long, long + ".0"},
		"long_exponents_256KiB": {"1e" + strings.Repeat("9", 256<<10), "1e" + strings.Repeat("9", 256<<10)},
	} {
		b.Run(name, func(b *testing.B) {
			var c Canonicalizer
			var x, y []byte
			b.SetBytes(int64(len(pair[0]) + len(pair[1])))
			for b.Loop() {
				var err error
				x, err = c.Append(x[:0], []byte(pair[0]))
				if err != nil {
					b.Fatal(err)
				}
				y, err = c.Append(y[:0], []byte(pair[1]))
				if err != nil || !bytes.Equal(x, y) {
					b.Fatal("not equal", err)
				}
			}
		})
	}
}
