package benchreport_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/benchreport"
	"github.com/flowness/ledger/cmd/ledgerctl/internal/pgtemp"
	"github.com/flowness/ledger/internal/ledgertest"
)

// binaries builds ingest, projector and ledgerctl once per test binary.
var binaries struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	os.Exit(code)
}

func build(t *testing.T) string {
	t.Helper()
	binaries.once.Do(func() {
		if binaries.dir, binaries.err = os.MkdirTemp("", "ledger-bench-bin-"); binaries.err != nil {
			return
		}
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", binaries.dir+"/", "./cmd/...")
		cmd.Dir = moduleRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			binaries.err = errors.New("go build ./cmd/...: " + err.Error() + "\n" + string(out))
		}
	})
	require.NoError(t, binaries.err)
	return binaries.dir
}

func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test's directory")
		dir = parent
	}
}

// A tiny external run: every part a process of its own, one worker. Each
// component must have spent CPU time on the events, as /proc/<pid>/stat
// tells it; a reading that is broken or points at the wrong process
// reports zero, or fails.
func TestExternalRunReportsEveryComponentsCPUPerEvent(t *testing.T) {
	bin := build(t)
	for _, raw := range []bool{false, true} {
		t.Run(map[bool]string{false: "sdk", true: "raw"}[raw], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var progress ledgertest.Buffer
			profile := filepath.Join(t.TempDir(), "ingest.pprof")
			// 5,000 events: CPU time is counted in 10 ms ticks, and each
			// component must spend a few on them.
			r, err := benchreport.RunExternal(ctx, benchreport.ExternalOptions{Events: 5000, Workers: 1, Raw: raw, Bin: bin,
				IngestProfile: profile, Progress: &progress})
			if errors.Is(err, pgtemp.ErrNotInstalled) {
				t.Skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed: ", err)
			}
			require.NoError(t, err, progress.String())
			t.Log("\n" + r.Table())

			require.Equal(t, "on", r.Machine.Fsync, "a deployment's PostgreSQL flushes its WAL")
			require.Equal(t, "on", r.Machine.SynchronousCommit)
			require.Equal(t, raw, r.Raw)
			require.Equal(t, 5000, r.Receipt.Events)
			require.Positive(t, r.Receipt.PerSecond)
			require.Equal(t, 5000, r.Projected.Events)
			require.Positive(t, r.Projected.PerSecond)

			var names []string
			var sum time.Duration
			for _, c := range r.Components {
				names = append(names, c.Name)
				require.Positive(t, c.Processes, c.Name)
				require.Positive(t, c.PerEvent, "%s: no CPU time per event", c.Name)
				require.Positive(t, c.PerCore, c.Name)
				require.InDelta(t, float64(c.CPU)/5000, float64(c.PerEvent), 1, c.Name)
				sum += c.CPU
			}
			require.Equal(t, []string{benchreport.ComponentNATS, benchreport.ComponentIngest, benchreport.ComponentProjector,
				benchreport.ComponentWorkers, benchreport.ComponentPostgres}, names)
			require.Equal(t, sum, r.Total.CPU)
			require.Greater(t, r.Components[4].Processes, 1, "PostgreSQL is the postmaster and its children")

			table := r.Table()
			for _, name := range names {
				require.Contains(t, table, "\n"+name+" ")
			}
			st, err := os.Stat(profile)
			require.NoError(t, err, "the ingest wrote its CPU profile as it stopped")
			require.Positive(t, st.Size())
		})
	}
}

func TestExternalRunNeedsItsBinaries(t *testing.T) {
	t.Parallel()
	_, err := benchreport.RunExternal(context.Background(), benchreport.ExternalOptions{Events: 10, Bin: t.TempDir(),
		Progress: &ledgertest.Buffer{}})
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "binary not found"), err.Error())
}
