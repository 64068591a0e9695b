package connect

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGCDefaults(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, c := range []struct {
		name   string
		getenv func(string) string
		cgroup string
		want   gcSettings
	}{
		{"nothing set, no container limit", env(), "", gcSettings{percent: GCPercentDefault}},
		{"cgroup v2 without a limit", env(), "max\n", gcSettings{percent: GCPercentDefault}},
		{"cgroup v1 without a limit", env(), "9223372036854771712\n", gcSettings{percent: GCPercentDefault}},
		{"a 1 GiB container", env(), "1073741824\n", gcSettings{percent: GCPercentDefault, limit: 966367641}},
		{"GOGC set: the runtime's", env("GOGC", "100"), "1073741824", gcSettings{limit: 966367641}},
		{"GOGC=off is set too", env("GOGC", "off"), "", gcSettings{}},
		{"GOMEMLIMIT set: the runtime's", env("GOMEMLIMIT", "512MiB"), "1073741824", gcSettings{percent: GCPercentDefault}},
		{"both set", env("GOGC", "50", "GOMEMLIMIT", "1GiB"), "1073741824", gcSettings{}},
		{"an unreadable limit", env(), "lots", gcSettings{percent: GCPercentDefault}},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, gcDefaults(c.getenv, c.cgroup))
		})
	}
}

// TuneGC sets what gcDefaults decides on the running process.
func TestTuneGCSetsTheProcesssGCPercent(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	TuneGC(nil)
	require.Equal(t, GCPercentDefault, debug.SetGCPercent(before))

	t.Setenv("GOGC", "100")
	debug.SetGCPercent(100)
	TuneGC(nil)
	require.Equal(t, 100, debug.SetGCPercent(before), "GOGC set in the environment is left to the runtime")
}

// In a container with a memory limit, TuneGC gives the runtime 90% of it as
// its soft limit.
func TestTuneGCSetsAContainersMemoryLimit(t *testing.T) {
	t.Setenv("GOGC", "100")
	t.Setenv("GOMEMLIMIT", "")
	limitFile := filepath.Join(t.TempDir(), "memory.max")
	require.NoError(t, os.WriteFile(limitFile, []byte("1073741824\n"), 0o600))
	files := cgroupMemoryFiles
	cgroupMemoryFiles = []string{filepath.Join(t.TempDir(), "absent"), limitFile}
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { cgroupMemoryFiles = files; debug.SetMemoryLimit(before) })
	TuneGC(nil)
	require.EqualValues(t, 966367641, debug.SetMemoryLimit(-1))
}
