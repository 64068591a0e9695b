package projection

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The merge patch reads each byte of its input a bounded number of times,
// whatever the shape: a key the patch repeats, keys it adds by the thousand,
// a path nested thousands deep. Quadratic work shows as a ratio of work to
// input that grows with n; linear work keeps it under the same constant at
// every size.
func TestMergePatchWorkIsLinearInItsInput(t *testing.T) {
	t.Parallel()
	const maxStepsPerByte = 3
	for _, c := range hostileMerge {
		for _, n := range []int{250, 1000, 4000} {
			target, patch := c.gen(n)
			var m merger
			got := m.merge(target, patch)
			in := len(target) + len(patch)
			require.LessOrEqual(t, m.steps, maxStepsPerByte*in, "%s n=%d: %d steps for %d bytes", c.name, n, m.steps, in)

			want := referenceMergePatch(decodeNumber(t, target), decodeNumber(t, patch))
			require.Equal(t, want, decodeNumber(t, got), "%s n=%d", c.name, n)
		}
	}
}

// A merger reused for one merge after another, as the Engine and the pool
// reuse it, gives each the result a fresh one gives.
func TestMergerReuseKeepsNothingBetweenMerges(t *testing.T) {
	t.Parallel()
	var reused merger
	docs := []string{`{"a":{"b":1,"c":[1]},"d":2}`, `{"a":{"b":null,"e":{"f":null,"g":1}},"x":1}`, `{"a":1,"a":{"z":1}}`,
		`{"a":{"b":{"c":{"d":null}}}}`, `[1]`, `{"b":2}`}
	for _, target := range docs {
		for _, patch := range docs {
			var fresh merger
			want := string(fresh.merge([]byte(target), []byte(patch)))
			require.Equal(t, want, string(reused.merge([]byte(target), []byte(patch))), "%s + %s", target, patch)
		}
	}
	for k := range 3 * mergerKeep {
		_ = reused.merge([]byte(`{}`), []byte(fmt.Sprintf(`{"k%d":1}`, k)))
	}
	big := wideObject(2 * mergerKeep)
	_ = reused.merge(big, big)
	require.Nil(t, reused.tm, "a merger lets go of the room a huge merge needed")
	require.Nil(t, reused.target, "a merger does not keep the documents alive")
}

// FuzzMergePatch: for any two documents, MergePatch errs exactly when one of
// them is not JSON, never panics, and otherwise gives what RFC 7386 section
// 2, applied to the documents as encoding/json decodes them, gives.
func FuzzMergePatch(f *testing.F) {
	seeds := [][2]string{
		{`{"a":"b"}`, `{"a":"c"}`},
		{`{"a":{"b":"c"}}`, `{"a":{"b":"d","c":null}}`},
		{`{"a":[{"b":"c"}]}`, `{"a":[1]}`},
		{`[1,2]`, `{"a":"b","c":null}`},
		{`{"a":1}`, `{"a":null,"a":2}`},
		{`{"a":{"y":2}}`, `{"a":{"x":1},"a":{"z":3}}`},
		{`{"a":{"y":2},"b":1}`, `{"a":{"x":1},"a":null}`},
		{`{"a":1,"a":2,"b":0}`, `{"a":null}`},
		{`{"a":1,"b":2}`, `{"\u0061":null,"b":3}`},
		{`{"\ud800":1}`, `{"\ufffd":null}`},
		{"{\"\xff\":1,\"b\":{}}", `{"\ufffd":2,"b":{"c":null}}`},
		{`{"n":1.50}`, `{"m":1e3,"n":-0}`},
		{` { "a" : { "x" : [ 1 , { "y" : null } ] } } `, `{"a":{"z":"{\"q\":1}"}}`},
		{``, `{"a":{"b":null}}`},
		{`{"a":1}`, ``},
		{`{"a":`, `{}`},
		{`{}`, `{"a"}`},
		{`{"a":[}`, ` `},
	}
	for _, c := range hostileMerge {
		target, patch := c.gen(20)
		seeds = append(seeds, [2]string{string(target), string(patch)})
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, target, patch []byte) {
		valid := func(b []byte) bool { return len(b) == 0 || json.Valid(b) }
		got, err := MergePatch(target, patch)
		if !valid(target) || !valid(patch) {
			require.ErrorIs(t, err, ErrInvalidJSON, "%q + %q", target, patch)
			return
		}
		require.NoError(t, err, "%q + %q", target, patch)
		require.True(t, json.Valid(got), "%q + %q gave %q", target, patch, got)
		require.Equal(t, referenceMergePatch(decodeOrNil(t, target), decodeOrNil(t, patch)), decodeNumber(t, got),
			"%q + %q gave %q", target, patch, got)
	})
}

// decodeOrNil decodes a document as MergePatch reads it: empty is null.
func decodeOrNil(t *testing.T, b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return decodeNumber(t, b)
}
