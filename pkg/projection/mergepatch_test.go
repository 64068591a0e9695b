package projection

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// RFC 7386 Appendix A, every example, plus the document of section 3.
func TestMergePatchRFC7386Examples(t *testing.T) {
	t.Parallel()
	cases := []struct{ target, patch, want string }{
		{`{"a":"b"}`, `{"a":"c"}`, `{"a":"c"}`},
		{`{"a":"b"}`, `{"b":"c"}`, `{"a":"b","b":"c"}`},
		{`{"a":"b"}`, `{"a":null}`, `{}`},
		{`{"a":"b","b":"c"}`, `{"a":null}`, `{"b":"c"}`},
		{`{"a":["b"]}`, `{"a":"c"}`, `{"a":"c"}`},
		{`{"a":"c"}`, `{"a":["b"]}`, `{"a":["b"]}`},
		{`{"a":{"b":"c"}}`, `{"a":{"b":"d","c":null}}`, `{"a":{"b":"d"}}`},
		{`{"a":[{"b":"c"}]}`, `{"a":[1]}`, `{"a":[1]}`},
		{`["a","b"]`, `["c","d"]`, `["c","d"]`},
		{`{"a":"b"}`, `["c"]`, `["c"]`},
		{`{"a":"foo"}`, `null`, `null`},
		{`{"a":"foo"}`, `"bar"`, `"bar"`},
		{`{"e":null}`, `{"a":1}`, `{"e":null,"a":1}`},
		{`[1,2]`, `{"a":"b","c":null}`, `{"a":"b"}`},
		{`{}`, `{"a":{"bb":{"ccc":null}}}`, `{"a":{"bb":{}}}`},
		{
			`{"title":"Goodbye!","author":{"givenName":"John","familyName":"Doe"},"tags":["example","sample"],"content":"This will be unchanged"}`,
			`{"title":"Hello!","phoneNumber":"+01-123-456-7890","author":{"familyName":null},"tags":["example"]}`,
			`{"title":"Hello!","author":{"givenName":"John"},"tags":["example"],"content":"This will be unchanged","phoneNumber":"+01-123-456-7890"}`,
		},
	}
	for _, c := range cases {
		got, err := MergePatch(json.RawMessage(c.target), json.RawMessage(c.patch))
		require.NoError(t, err, "%s + %s", c.target, c.patch)
		// Byte equality: members keep their order and added ones come last,
		// so the KV value does not churn.
		require.Equal(t, c.want, string(got), "%s + %s", c.target, c.patch)
	}
}

// Cases around the edges of the byte-level implementation.
func TestMergePatchEdges(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, target, patch, want string }{
		{"null target", ``, `{"a":1,"b":null}`, `{"a":1}`},
		{"empty patch is null", `{"a":1}`, ``, `null`},
		{"scalar target", `7`, `{"a":{"b":null,"c":1}}`, `{"a":{"c":1}}`},
		{"whitespace and nesting", ` { "a" : { "x" : [ 1 , { "y" : null } ] } , "b" : "}" } `, `{"a":{"z":"{\"q\":1}"}}`,
			`{"a":{"x":[ 1 , { "y" : null } ],"z":"{\"q\":1}"},"b":"}"}`},
		{"escaped key names the same member", `{"a":1,"b":2}`, `{"\u0061":null,"b":3}`, `{"b":3}`},
		{"the last of duplicate keys in the patch wins", `{"a":1}`, `{"a":null,"a":2}`, `{"a":2}`},
		{"the last duplicate patches the original", `{"a":{"y":2}}`, `{"a":{"x":1},"a":{"z":3}}`, `{"a":{"y":2,"z":3}}`},
		{"a deleted duplicate stays deleted", `{"a":{"y":2},"b":1}`, `{"a":{"x":1},"a":null}`, `{"b":1}`},
		{"duplicate keys in the target mean the last", `{"a":1,"a":2,"b":0}`, `{"a":null}`, `{"b":0}`},
		{"numbers keep their spelling", `{"n":1.50}`, `{"m":1e3}`, `{"n":1.50,"m":1e3}`},
		{"object value replaces a scalar", `{"a":1}`, `{"a":{"b":2}}`, `{"a":{"b":2}}`},
		{"empty object patch", `{"a":1}`, `{}`, `{"a":1}`},
		{"large objects use an index",
			`{"k00":0,"k01":1,"k02":2,"k03":3,"k04":4,"k05":5,"k06":6,"k07":7,"k08":8,"k09":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k16":17}`,
			`{"k03":null,"k16":"x","k17":{"a":null}}`,
			`{"k00":0,"k01":1,"k02":2,"k04":4,"k05":5,"k06":6,"k07":7,"k08":8,"k09":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":"x","k17":{}}`},
	}
	for _, c := range cases {
		got, err := MergePatch(json.RawMessage(c.target), json.RawMessage(c.patch))
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, string(got), c.name)
	}

	_, err := MergePatch(json.RawMessage(`{"a":`), json.RawMessage(`{}`))
	require.ErrorIs(t, err, ErrInvalidJSON)
	_, err = MergePatch(json.RawMessage(`{}`), json.RawMessage(`{"a"}`))
	require.ErrorIs(t, err, ErrInvalidJSON)
}

// referenceMergePatch is RFC 7386 section 2 as written, on decoded values.
func referenceMergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = referenceMergePatch(t[k], v)
	}
	return t
}

func decodeNumber(t require.TestingT, b []byte) any {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	require.NoError(t, d.Decode(&v), "%s", b)
	return v
}

// The byte-level merge agrees with the RFC's algorithm on decoded values, for
// any documents, including a chain of patches as the reducer applies them.
func TestMergePatchMatchesReference(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		docs := rapid.SliceOfN(rapid.OneOf(jsonObject(3), jsonObject(3), jsonValue(2)), 1, 6).Draw(rt, "docs")
		var got json.RawMessage
		var want any
		for k, d := range docs {
			spelled := []byte(spell(rt, d, true))
			var err error
			got, err = MergePatch(got, spelled)
			require.NoError(rt, err)
			require.True(rt, json.Valid(got), "%s", got)
			want = referenceMergePatch(want, decodeNumber(rt, spelled))
			require.Equal(rt, want, decodeNumber(rt, got), "after patch %d %s", k, spelled)
		}
	})
}
