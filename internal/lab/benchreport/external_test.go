package benchreport_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/lab/benchreport"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/pgtemp"
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

// A tiny comparison of external runs, the SDK's then the raw publishers':
// every part a process of its own, one worker. Each component must have
// spent CPU time on the events, as /proc/<pid>/stat tells it; a reading
// that is broken or points at the wrong process reports zero, or fails.
func TestExternalRunReportsEveryComponentsCPUPerEvent(t *testing.T) {
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var progress ledgertest.Buffer
	profile := filepath.Join(t.TempDir(), "ingest.pprof")
	// 5,000 events: CPU time is counted in 10 ms ticks, and each component
	// must spend a few on them.
	c, err := benchreport.RunExternalCompare(ctx, benchreport.ExternalOptions{Events: 5000, Tasks: 300, Workers: 1, Bin: bin,
		IngestProfile: profile, Warmup: 1000, Progress: &progress}, 1)
	if errors.Is(err, pgtemp.ErrNotInstalled) {
		t.Skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed: ", err)
	}
	require.NoError(t, err, progress.String())
	t.Log("\n" + c.Table())
	require.Len(t, c.Rounds, 1)
	rd := c.Rounds[0]
	require.InDelta(t, rd.SDK.Receipt.PerSecond/rd.Raw.Receipt.PerSecond, c.Ratio, 1e-9)
	require.Contains(t, c.Table(), "SDK / raw, median of 1 rounds")

	for _, r := range []benchreport.ExternalReport{rd.SDK, rd.Raw} {
		name := map[bool]string{false: "sdk", true: "raw"}[r.Raw]
		require.Equal(t, "on", r.Machine.Fsync, "a deployment's PostgreSQL flushes its WAL")
		require.Equal(t, "on", r.Machine.SynchronousCommit)
		require.Equal(t, 5000, r.Receipt.Events, name)
		require.Equal(t, 300, r.Tasks, name)
		require.Equal(t, 1000, r.Warmup, "%s: the ledger warmed up with 1,000 events first", name)
		require.Contains(t, r.Table(), "warmed up first with 1,000 events of other tasks", name)
		require.Positive(t, r.Receipt.PerSecond, name)
		require.Equal(t, 5000, r.Projected.Events, name)
		require.Positive(t, r.Projected.PerSecond, name)
		// The ingest's stages over the run's window: its events, not the
		// warm-up's before it.
		receipts := uint64(0)
		for _, st := range r.Stages {
			if st.Stage == "receipt" {
				receipts = st.Count
			}
		}
		require.EqualValues(t, 5000, receipts, "%s: the ingest's receipt stage counts the run's events", name)
		require.Contains(t, r.Table(), "the ingest's stages over the same window", name)
		if r.Receipt.Elapsed >= 2*benchreport.FirstWindow {
			require.Equal(t, 5000, r.FirstWindow.Events+r.AfterFirstWindow.Events, name)
		} else {
			require.Zero(t, r.FirstWindow, "%s: a run too short to split", name)
		}

		var names []string
		var sum time.Duration
		for _, c := range r.Components {
			names = append(names, c.Name)
			require.Positive(t, c.Processes, "%s: %s", name, c.Name)
			require.Positive(t, c.PerEvent, "%s: %s: no CPU time per event", name, c.Name)
			require.Positive(t, c.PerCore, "%s: %s", name, c.Name)
			require.InDelta(t, float64(c.CPU)/5000, float64(c.PerEvent), 1, "%s: %s", name, c.Name)
			sum += c.CPU
		}
		require.Equal(t, []string{benchreport.ComponentNATS, benchreport.ComponentIngest, benchreport.ComponentProjector,
			benchreport.ComponentWorkers, benchreport.ComponentPostgres}, names)
		require.Equal(t, sum, r.Total.CPU)
		require.Greater(t, r.Components[4].Processes, 1, "PostgreSQL is the postmaster and its children")

		// The floor ran on the deployment's PostgreSQL after the run, on
		// as many events, and the receipts are a ratio to it.
		require.Equal(t, benchreport.LabelFloor, r.Floor.Label, name)
		require.Equal(t, 5000, r.Floor.Events, name)
		require.Positive(t, r.Floor.PerSecond, name)
		require.InDelta(t, r.Receipt.PerSecond/r.Floor.PerSecond, r.Receipt.Relative, 1e-9, name)
		require.Equal(t, "the floor", r.Receipt.RelativeTo, name)

		table := r.Table()
		for _, name := range names {
			require.Contains(t, table, "\n"+name+" ")
		}
		require.Contains(t, table, benchreport.LabelFloor+", after the run: ")
		require.Contains(t, table, fmt.Sprintf("%.2f × the floor", r.Receipt.Relative))
	}
	require.Equal(t, []bool{false, true}, []bool{rd.SDK.Raw, rd.Raw.Raw}, "the SDK's run, then the raw publishers'")
	st, err := os.Stat(profile)
	require.NoError(t, err, "the ingest wrote its CPU profile as it stopped")
	require.Positive(t, st.Size())
}

// A latency run without a rate measures the raw publishers' full speed
// first, then paces the SDK workers and the bare pipeline at half of it,
// each a process of its own, and sets their percentiles side by side.
func TestExternalLatencyRunSetsTheSDKBesideTheBarePipeline(t *testing.T) {
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var progress ledgertest.Buffer
	r, err := benchreport.RunExternal(ctx, benchreport.ExternalOptions{Events: 4000, Tasks: 200, Workers: 2, Bin: bin,
		Latency: true, Warmup: -1, Progress: &progress, Roles: true})
	if errors.Is(err, pgtemp.ErrNotInstalled) {
		t.Skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed: ", err)
	}
	require.NoError(t, err, progress.String())
	t.Log("\n" + r.Table())
	l := r.Latency
	require.NotNil(t, l)
	require.Equal(t, 4000, r.Receipt.Events, "the saturation run")
	require.Zero(t, r.Warmup, "no warm-up asked for")
	require.InDelta(t, r.Receipt.PerSecond, l.Saturation, 1e-9)
	require.Equal(t, max(int(l.Saturation/2), 1), l.Rate)
	var names []string
	for _, c := range r.Components {
		names = append(names, c.Name)
	}
	require.NotContains(t, names, benchreport.ComponentProjector, "a latency run has no projector")
	for _, row := range []benchreport.Row{l.Path, l.Bare} {
		require.Equal(t, 4000, row.Events, row.Label)
		require.True(t, row.Latency, row.Label)
		require.Positive(t, row.P50, row.Label)
		require.GreaterOrEqual(t, row.P99, row.P50, row.Label)
		require.Positive(t, row.PerSecond, row.Label)
		require.Contains(t, r.Table(), row.Label)
	}
	require.Contains(t, l.Path.Label, "SDK publish → receipt")
	require.Contains(t, l.Bare.Label, "bare publish → commit")
	require.InDelta(t, float64(l.Path.P99)/float64(l.Bare.P99), l.Path.Relative, 1e-9)
	require.Equal(t, "bare p99", l.Path.RelativeTo)
	// The ingest's stages over the path's phases only: the saturation run
	// before them is not counted.
	stages := map[string]benchreport.StageRow{}
	for _, st := range l.Stages {
		stages[st.Stage] = st
	}
	for _, name := range []string{"delivery", "queue", "receipt"} {
		require.GreaterOrEqual(t, stages[name].Count, uint64(4000), "every event of the path once: %s", name)
		require.Less(t, stages[name].Count, uint64(8000), "the saturation run is not counted: %s", name)
	}
	require.Positive(t, stages["append"].Count)
	require.GreaterOrEqual(t, stages["receipt"].Mean, stages["delivery"].Mean, "the receipt stage covers the delivery")
	require.Contains(t, r.Table(), "the ingest's stages on the SDK path")
}

func TestExternalRunNeedsItsBinaries(t *testing.T) {
	t.Parallel()
	_, err := benchreport.RunExternal(context.Background(), benchreport.ExternalOptions{Events: 10, Bin: t.TempDir(),
		Progress: &ledgertest.Buffer{}})
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "binary not found"), err.Error())
}
