package admin

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStartCPUProfileWritesAProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	stop, err := StartCPUProfile(path)
	require.NoError(t, err)
	_, err = StartCPUProfile(filepath.Join(t.TempDir(), "second.pprof"))
	require.Error(t, err, "one profile at a time")
	stop()
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Positive(t, st.Size(), "a profile was written")

	_, err = StartCPUProfile(filepath.Join(t.TempDir(), "no", "such", "dir", "cpu.pprof"))
	require.ErrorContains(t, err, "cpu profile")
}
