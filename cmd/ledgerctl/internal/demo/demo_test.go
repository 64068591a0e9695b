package demo_test

import (
	"bytes"
	"context"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/demo"
	"github.com/flowness/ledger/internal/dbtest"
)

// The demo plays the stories against the database it is given, and its
// summary is what the ledger decided.
func TestDemoPlaysBothStories(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	var out bytes.Buffer
	s, err := demo.Run(context.Background(), demo.Options{DatabaseURL: db.URL, Out: &out})
	require.NoError(t, err, out.String())
	require.Equal(t, 8, s.Committed, out.String())
	require.Equal(t, 1, s.Duplicates, out.String())
	require.Equal(t, map[string]int{"stale/superseded": 1, "conflict/overtaken": 1}, s.Rejected, out.String())
	for _, want := range []string{"holds version 2 until version 1 arrives: no verdict yet, task head is version 0, no projection yet",
		"receipt: version 2 stale/superseded", "Ledger-Verdict=stale", `"B's invoice"`,
		"is behind: version 2 while the ledger is at version 4", `version 4, status "archived"`,
		"receipt: version 3 committed", "receipt: version 2 conflict/overtaken", `kind "snapshot", version 3, data {"temp_c":23.1}`} {
		require.Contains(t, out.String(), want)
	}
	// The retry leaves the projection's revision as it was: 1 or 2, as
	// the projector wrote versions 1 and 2 together or one by one.
	m := regexp.MustCompile(`projection report-7-\S+: version 2, status "completed", .* \(revision (\d+)\)`).FindStringSubmatch(out.String())
	require.NotNil(t, m, out.String())
	require.Contains(t, out.String(), `still version 2, status "completed", revision `+m[1]+` unchanged`)
	t.Log("\n" + out.String())
}

// With no database given, the demo starts its own throwaway PostgreSQL.
func TestDemoStartsItsOwnPostgres(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	s, err := demo.Run(context.Background(), demo.Options{DatabaseURL: "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", Out: &out})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "throwaway")
	require.Equal(t, 8, s.Committed, out.String())
}
