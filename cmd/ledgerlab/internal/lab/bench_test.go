package lab_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
)

func TestBenchJSONPrintsOnlyTheChosenSections(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	r := run(t, "bench", "-database-url", db.URL, "-json", "-only", "baselines", "-events", "500").ok(t)
	var report map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &report), r.stdout)
	require.Equal(t, []any{"baselines"}, report["sections"])
	for _, row := range []string{"per_event_insert", "set_insert", "copy", "schema_insert", "fence_append"} {
		require.Contains(t, report, row)
		require.Greater(t, report[row].(map[string]any)["per_second"], 0.0, row)
	}
	for _, row := range []string{"full_pipeline", "sdk_receipt", "latency_bare", "catch_up"} {
		require.NotContains(t, report, row, "a section that did not run has no row")
	}
}

func TestBenchRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-only", "pipelines"},
		{"-only", "pipeline,"},
		{"-rounds", "0"},
		{"-rate", "-1"},
		{"-workers", "0"},
		{"-duration", "0s"},
	} {
		r := run(t, append([]string{"bench"}, args...)...)
		require.Equal(t, 2, r.code, "%v is a usage error; stderr: %s", args, r.stderr)
	}
}

func TestBenchCommandPrintsTheReport(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	r := run(t, "bench", "-database-url", db.URL, "-events", "1000", "-rate", "300", "-duration", "500ms", "-workers", "2").ok(t)
	for _, row := range []string{"per-event fenced INSERT", "set-based fenced insert", "COPY", "fence.Append",
		"pipeline: SDK → ingest → receipt", "publish → KV"} {
		require.Contains(t, r.stdout, row)
	}
	require.Equal(t, 2, run(t, "bench", "-workers", "17").code)
}
