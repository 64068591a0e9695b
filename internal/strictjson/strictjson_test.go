package strictjson_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/strictjson"
)

type inner struct {
	N int `json:"n"`
}

type outer struct {
	A  string    `json:"a"`
	At time.Time `json:"at"`
	In *inner    `json:"in"`
	L  []inner   `json:"l,omitempty"`
}

func TestDecodeTakesExactKeysOnce(t *testing.T) {
	t.Parallel()
	var o outer
	require.NoError(t, strictjson.Decode([]byte(`{"a":"x","at":"2026-01-01T00:00:00Z","in":{"n":1}}`), &o))
	require.Equal(t, 1, o.In.N)
	require.NoError(t, strictjson.Decode([]byte(`{"a":"x","in":null}`), &o))
	for _, bad := range []string{
		`{"A":"x"}`, `{"a":"x","a":"y"}`, `{"a":"x","A":"y"}`, `{"in":{"N":1}}`, `{"in":{"n":1,"n":2}}`,
		`{"b":1}`, `{"a":"x"}}`, `{"a":"x"} {}`, `[]`, ``,
	} {
		require.Error(t, strictjson.Decode([]byte(bad), &outer{}), bad)
	}
}

// Whatever the bytes, Decode does not panic, and what it takes decodes to
// the same value again.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"a":"x","at":"2026-01-01T00:00:00Z","in":{"n":1},"l":[{"n":2}]}`, `{"a":"x","A":"y"}`, `{"in":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var o outer
		if strictjson.Decode(data, &o) != nil {
			return
		}
		var again outer
		require.NoError(t, strictjson.Decode(data, &again))
		require.Equal(t, o, again)
	})
}
