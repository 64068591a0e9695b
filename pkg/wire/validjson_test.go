package wire

import (
	"encoding/json"
	"strings"
	"testing"
)

// validJSONSeeds are values json.Valid takes and refuses, at the edges the
// scanner checks: numbers, escapes, literals, nesting, white space.
var validJSONSeeds = []string{
	`{"step":1,"note":"x"}`, ` [1, -0.5e+3, true, false, null] `, `"a\u00e9\n"`, `0`, `-0`, `1E9`,
	"\"\xff\xfe\"", `{}`, `[]`, `{"a":{"b":[{}]}}`, "\t\r\n{} \n",
	``, ` `, `01`, `1.`, `-`, `.5`, `+1`, `1e`, `tru`, `nul`, `"\x"`, `"\u12"`, "\"a\tb\"",
	`{"a" 1}`, `{"a":1,}`, `[1 2]`, `[1,]`, `{1:2}`, `"abc`, `{"a":1}}`, `{} {}`, `[`, `]`, "\x00",
}

func FuzzValidJSONMatchesEncodingJSON(f *testing.F) {
	for _, s := range validJSONSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := ValidJSON(data), json.Valid(data); got != want {
			t.Fatalf("ValidJSON(%q) = %v, json.Valid says %v", data, got, want)
		}
	})
}

// TestValidJSONNestsAsDeepAsEncodingJSON: 10,000 levels are valid, 10,001
// are not, for both. Switch: lower maxJSONDepth by one; 10,000 levels are
// refused.
func TestValidJSONNestsAsDeepAsEncodingJSON(t *testing.T) {
	for _, n := range []int{10000, 10001} {
		for _, open := range []string{"[", `{"a":`} {
			closer := map[string]string{"[": "]", `{"a":`: "}"}[open]
			data := []byte(strings.Repeat(open, n) + "1" + strings.Repeat(closer, n))
			if got, want := ValidJSON(data), json.Valid(data); got != want {
				t.Errorf("%d levels of %s: ValidJSON %v, json.Valid %v", n, open, got, want)
			}
			if want := n <= 10000; ValidJSON(data) != want {
				t.Errorf("%d levels of %s: ValidJSON %v, want %v", n, open, ValidJSON(data), want)
			}
		}
	}
}

// BenchmarkValidJSON: the bench's payload shape (about 190 bytes) both ways.
func BenchmarkValidJSON(b *testing.B) {
	p := []byte(`{"step":17,"note":"` + strings.Repeat("x", 150) + `","ok":true,"n":[1,2.5,-3e2]}`)
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for range b.N {
			if !json.Valid(p) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("scanner", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for range b.N {
			if !ValidJSON(p) {
				b.Fatal("invalid")
			}
		}
	})
}

// TestAnyStrSpecialFindsEveryByteStrLooksAt: a word with one byte that
// strSpecial marks, at any of the eight places, among bytes it does not.
// Switch: anyStrSpecial without its backslash term; '\\' is missed.
func TestAnyStrSpecialFindsEveryByteStrLooksAt(t *testing.T) {
	for c := range 256 {
		for at := range 8 {
			w := []byte("abcdefgh")
			w[at] = byte(c)
			x := uint64(0)
			for k := 7; k >= 0; k-- {
				x = x<<8 | uint64(w[k])
			}
			if got := anyStrSpecial(x); got != strSpecial[c] {
				t.Fatalf("byte %#x at %d: anyStrSpecial %v, strSpecial %v", c, at, got, strSpecial[c])
			}
		}
	}
}
