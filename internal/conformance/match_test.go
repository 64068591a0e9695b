package conformance_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/conformance"
)

func TestMatchJudgesASubsetWithItsSpecialValues(t *testing.T) {
	t.Parallel()
	got := decode(t, `{"verdict":"stale","seq":0,"reason":"superseded","heads":[{"v":1}],"partition":null,"message":"generation 6 was never granted","in":"LEDGER_IN","inbox":"LEDGER_IN_conf-a","log":"LEDGER_LOG"}`)
	for _, c := range []struct {
		want string
		ok   bool
	}{
		{`{"verdict":"stale"}`, true},
		{`{"verdict":"committed"}`, false},
		{`{"seq":"$positive"}`, false},
		{`{"reason":"$any","missing":"$absent","partition":null,"nothere":null}`, true},
		{`{"reason":"$absent"}`, false},
		{`{"missing":"$any"}`, false},
		{`{"message":"$contains:never granted"}`, true},
		{`{"message":"$contains:not the current one"}`, false},
		{`{"in":"$inbox","inbox":"$inbox"}`, true},
		{`{"log":"$inbox"}`, false},
		{`{"seq":"$inbox"}`, false},
		{`{"heads":[{"v":1}]}`, true},
		{`{"heads":[{"v":1},{"v":2}]}`, false},
		{`{"seq":0,"heads":[{"v":2}]}`, false},
	} {
		d := conformance.Match("x", decode(t, c.want), got)
		require.Equal(t, c.ok, d == "", "%s: %s", c.want, d)
	}
}

func TestLoadGivesEachNameOneFreshID(t *testing.T) {
	t.Parallel()
	b := conformance.WithIDs([]byte(`["${id_a}","${id_b}","${id_a}"]`))
	var ids []string
	require.NoError(t, json.Unmarshal(b, &ids))
	require.Len(t, ids[0], 26)
	require.Equal(t, ids[0], ids[2])
	require.NotEqual(t, ids[0], ids[1])
}

func decode(t *testing.T, s string) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(s), &v))
	return v
}
