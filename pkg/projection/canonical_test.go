package projection

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// Generators of JSON values as Go values (nil, bool, int, string, []any,
// map[string]any) over small alphabets, so that keys collide and values
// repeat, and spell, which writes one value in many equivalent ways.

var (
	genKeys    = []string{"a", "b", "c", "é", `q"k`}
	genStrings = []string{"", "x", "é", "tab\t", `q"uote`, `back\slash`, "/", "\u2028", "😀", "\x01"}
)

func jsonValue(depth int) *rapid.Generator[any] {
	return rapid.Custom(func(t *rapid.T) any {
		kinds := 3
		if depth > 0 {
			kinds = 5
		}
		switch rapid.IntRange(0, kinds).Draw(t, "kind") {
		case 0:
			return nil
		case 1:
			return rapid.Bool().Draw(t, "bool")
		case 2:
			return rapid.IntRange(-3, 3).Draw(t, "int")
		case 3:
			return rapid.SampledFrom(genStrings).Draw(t, "string")
		case 4:
			return append([]any{}, rapid.SliceOfN(jsonValue(depth-1), 0, 3).Draw(t, "array")...)
		default:
			return jsonObject(depth-1).Draw(t, "object")
		}
	})
}

func jsonObject(depth int) *rapid.Generator[any] {
	return rapid.Custom(func(t *rapid.T) any {
		m := map[string]any{}
		for k, v := range rapid.MapOfN(rapid.SampledFrom(genKeys), jsonValue(depth), 0, 4).Draw(t, "members") {
			m[k] = v
		}
		return m
	})
}

// spell writes v as JSON. With vary it picks, at random, whitespace, member
// order, escapes, number spellings, and a shadowed duplicate key (which a
// decoder, like jsonb, overrides with the last one).
func spell(t *rapid.T, v any, vary bool) string {
	var b strings.Builder
	writeSpelled(t, &b, v, vary)
	return b.String()
}

func writeSpelled(t *rapid.T, b *strings.Builder, v any, vary bool) {
	space := func() {
		if vary {
			b.WriteString(rapid.SampledFrom([]string{"", "", " ", "\n\t "}).Draw(t, "ws"))
		}
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case int:
		b.WriteString(spellInt(t, v, vary))
	case string:
		spellString(t, b, v, vary)
	case []any:
		b.WriteByte('[')
		for k, e := range v {
			if k > 0 {
				b.WriteByte(',')
			}
			space()
			writeSpelled(t, b, e, vary)
			space()
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if vary {
			keys = rapid.Permutation(keys).Draw(t, "order")
		}
		b.WriteByte('{')
		if vary && len(keys) > 0 && rapid.Bool().Draw(t, "shadow") {
			space()
			spellString(t, b, keys[len(keys)-1], vary)
			b.WriteByte(':')
			writeSpelled(t, b, jsonValue(1).Draw(t, "shadowed"), vary)
			b.WriteByte(',')
		}
		for k, key := range keys {
			if k > 0 {
				b.WriteByte(',')
			}
			space()
			spellString(t, b, key, vary)
			space()
			b.WriteByte(':')
			space()
			writeSpelled(t, b, v[key], vary)
		}
		space()
		b.WriteByte('}')
	default:
		panic(fmt.Sprintf("unexpected %T", v))
	}
}

func spellInt(t *rapid.T, n int, vary bool) string {
	s := strconv.Itoa(n)
	if !vary {
		return s
	}
	switch rapid.IntRange(0, 5).Draw(t, "number") {
	case 1:
		return s + ".0"
	case 2:
		return s + ".000"
	case 3:
		return s + "e0"
	case 4:
		if n == 0 {
			return "0.0e5"
		}
		return s + "0E-1"
	case 5:
		if n == 0 {
			return "-0"
		}
		return s + "00e-2"
	}
	return s
}

func spellString(t *rapid.T, b *strings.Builder, s string, vary bool) {
	b.WriteByte('"')
	for _, r := range s {
		if vary && rapid.IntRange(0, 3).Draw(t, "escape") == 0 {
			if r == '/' {
				b.WriteString(`\/`)
				continue
			}
			if r > 0xffff {
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(b, `\u%04X\u%04x`, r1, r2)
				continue
			}
			fmt.Fprintf(b, `\u%04x`, r)
			continue
		}
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

func canonicalString(t require.TestingT, in string) string {
	c := newCanonicalizer()
	require.NoError(t, c.canonical([]byte(in)), in)
	return string(c.buf)
}

// The projection fingerprints canonjson's form; these pin the spellings the
// log and the database give one payload (see canonjson's tests for the rest).
func TestCanonicalFormIgnoresSpellingOnly(t *testing.T) {
	t.Parallel()
	same := [][2]string{
		{`{"b":1,"a":2}`, ` { "a" : 2 , "b" : 1 } `},
		{`{"a":1,"a":2}`, `{"a":2}`},
		{`"\u00e9\/\n\"\\"`, "\"é/\\n\\\"\\\\\""},
		{`[1, 1.0, 10e-1, 0.1e1, 100E-2]`, `[1,1,1,1,1]`},
		{`{"n": 1.50, "m": [0.5, 2]}`, `{"m": [0.5, 2], "n": 1.5}`}, // as jsonb renders it back
	}
	for _, p := range same {
		require.Equal(t, canonicalString(t, p[0]), canonicalString(t, p[1]), "%s ~ %s", p[0], p[1])
	}
	different := [][2]string{
		{`{"a":1}`, `{"a":1,"b":null}`},
		{`1`, `10`},
		{`"1"`, `1`},
	}
	for _, p := range different {
		require.NotEqual(t, canonicalString(t, p[0]), canonicalString(t, p[1]), "%s !~ %s", p[0], p[1])
	}
}

// Every spelling of a value has one fingerprint, and different values have
// different ones.
func TestFingerprintIsAboutTheValue(t *testing.T) {
	t.Parallel()
	c := newCanonicalizer()
	fp := func(rt *rapid.T, typ, s string) fingerprint {
		f, err := c.fingerprint(typ, []byte(s))
		require.NoError(rt, err, s)
		return f
	}
	rapid.Check(t, func(rt *rapid.T) {
		v := jsonValue(3).Draw(rt, "v")
		w := jsonValue(3).Draw(rt, "w")
		a, b := spell(rt, v, true), spell(rt, v, true)
		require.Equal(rt, fp(rt, "x", a), fp(rt, "x", b), "%s ~ %s", a, b)
		require.NotEqual(rt, fp(rt, "x", a), fp(rt, "y", a), "the type is part of the content")

		vj, err := json.Marshal(v)
		require.NoError(rt, err)
		wj, err := json.Marshal(w)
		require.NoError(rt, err)
		if string(vj) != string(wj) {
			require.NotEqual(rt, fp(rt, "x", a), fp(rt, "x", spell(rt, w, true)), "%s !~ %s", vj, wj)
		}
	})
}

// The canonicalizer doubles as the engine's validator, so it must accept
// exactly what encoding/json accepts.
func TestCanonicalAcceptsExactlyValidJSON(t *testing.T) {
	t.Parallel()
	const alphabet = "{}[]\":,0123456789.-+eEtrufalsn \\/u\x01aé"
	rapid.Check(t, func(rt *rapid.T) {
		in := []byte(spell(rt, jsonValue(3).Draw(rt, "v"), true))
		require.True(rt, json.Valid(in), "%s", in)
		for n := rapid.IntRange(0, 3).Draw(rt, "edits"); n > 0; n-- {
			at := rapid.IntRange(0, len(in)).Draw(rt, "at")
			c := alphabet[rapid.IntRange(0, len(alphabet)-1).Draw(rt, "byte")]
			switch rapid.IntRange(0, 2).Draw(rt, "edit") {
			case 0:
				in = slices.Insert(in, at, c)
			case 1:
				if at < len(in) {
					in = slices.Delete(in, at, at+1)
				}
			default:
				if at < len(in) {
					in[at] = c
				}
			}
		}
		err := newCanonicalizer().canonical(in)
		require.Equal(rt, json.Valid(in), err == nil, "%q: %v", in, err)
	})
}
