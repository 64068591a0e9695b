package projection

import (
	"fmt"
	"strings"
	"testing"
)

// hostileMerge builds the shapes of merge patch that cost the old byte-level
// merge time quadratic in its input, at a size proportional to n: targets
// about 50n bytes, patches about 7n.
var hostileMerge = []struct {
	name string
	gen  func(n int) (target, patch []byte)
}{
	// One key repeated n times in the patch, each time with an object.
	{"repeated_key", func(n int) ([]byte, []byte) {
		return wideObject(n), []byte("{" + strings.Repeat(`"a":{},`, n) + `"a":{}}`)
	}},
	// n keys the target does not have.
	{"added_keys", func(n int) ([]byte, []byte) {
		var p strings.Builder
		p.WriteString("{")
		for k := range n {
			fmt.Fprintf(&p, `"n%d":1,`, k)
		}
		p.WriteString(`"z":1}`)
		return []byte(`{"a":1}`), []byte(p.String())
	}},
	// Target and patch nested n/8 deep along the same path.
	{"deep", func(n int) ([]byte, []byte) {
		d := n / 8
		t := strings.Repeat(`{"a":`, d) + `{"big":"` + strings.Repeat("x", 40*n) + `"}` + strings.Repeat("}", d)
		p := strings.Repeat(`{"a":`, d) + `{"x":1}` + strings.Repeat("}", d)
		return []byte(t), []byte(p)
	}},
}

// wideObject is an object of n members of about 50 bytes, among them "a".
func wideObject(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"a":{"x":1}`)
	for k := range n {
		fmt.Fprintf(&b, `,"key-%06d":"value of the member number %06d"`, k, k)
	}
	b.WriteString("}")
	return []byte(b.String())
}

// BenchmarkMergePatchHostile reports the cost per input byte of the hostile
// shapes at two sizes four times apart: linear work keeps ns/byte flat, the
// old quadratic merge multiplied it by about four.
func BenchmarkMergePatchHostile(b *testing.B) {
	for _, c := range hostileMerge {
		for _, n := range []int{1000, 4000} {
			target, patch := c.gen(n)
			b.Run(fmt.Sprintf("%s/n=%d", c.name, n), func(b *testing.B) {
				b.ReportAllocs()
				for range b.N {
					if _, err := MergePatch(target, patch); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(target)+len(patch)), "ns/byte")
			})
		}
	}
}
