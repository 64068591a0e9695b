package lab_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBenchExternalRefusesTheFlagsOfTheOtherMode(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-external", "-only", "sdk"},
		{"-external", "-rounds", "3"},
		{"-external", "-database-url", "postgres://x@127.0.0.1/y"},
		{"-external", "-cpuprofile", "cpu.out"},
		{"-external", "-workers", "17"},
		{"-external", "-events", "0"},
		{"-raw"},
		{"-bin", "bin"},
		{"-ingest-profile", "ingest.pprof"},
		{"-latency"},
		{"-external", "-rate", "1000"},
		{"-external", "-latency", "-rate", "-1"},
		{"-external", "-latency", "-compare", "2"},
		{"-external", "-warmup", "-5"},
		{"-warmup", "100"},
	} {
		r := run(t, append([]string{"bench"}, args...)...)
		require.Equal(t, 2, r.code, "%v is a usage error; stderr: %s", args, r.stderr)
	}
}

func TestBenchWorkerRefusesWhatCannotRun(t *testing.T) {
	t.Parallel()
	r := run(t, "bench", "worker", "-run", "a.b", "-workers", "2", "-worker", "1", "-events", "10")
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, "run id")

	r = run(t, "bench", "worker", "-run", "ab", "-workers", "1", "-worker", "0", "-events", "10", "-bare", "-rate", "100",
		"-database-url", "")
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, "database URL")
}
