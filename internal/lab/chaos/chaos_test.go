package chaos_test

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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/lab/chaos"
	"github.com/flowness/ledger/internal/pgtemp"
)

// binaries builds ingest, projector and ledgerctl once per test binary, and
// the ingest again with the tag ledger_nofence (the fence switched off) and
// with the tag ledger_noguards (the failover guards switched off).
var binaries struct {
	once     sync.Once
	dir      string
	nofence  string
	noguards string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	os.Exit(code)
}

func build(t *testing.T) (dir, nofenceIngest string) {
	t.Helper()
	binaries.once.Do(func() {
		binaries.dir, binaries.err = os.MkdirTemp("", "ledger-chaos-bin-")
		if binaries.err != nil {
			return
		}
		root, err := moduleRoot()
		if err != nil {
			binaries.err = err
			return
		}
		gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
		for _, args := range [][]string{
			{"build", "-o", binaries.dir + "/", "./cmd/..."},
			{"build", "-tags", "ledger_nofence", "-o", filepath.Join(binaries.dir, "nofence", "ingest"), "./cmd/ingest"},
			{"build", "-tags", "ledger_noguards", "-o", filepath.Join(binaries.dir, "noguards", "ingest"), "./cmd/ingest"},
		} {
			cmd := exec.Command(gobin, args...)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				binaries.err = errors.New("go " + strings.Join(args, " ") + ": " + err.Error() + "\n" + string(out))
				return
			}
		}
		binaries.nofence = filepath.Join(binaries.dir, "nofence", "ingest")
		binaries.noguards = filepath.Join(binaries.dir, "noguards", "ingest")
	})
	require.NoError(t, binaries.err)
	return binaries.dir, binaries.nofence
}

// moduleRoot is the directory of the go.mod above the test's directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	for err == nil {
		if _, serr := os.Stat(filepath.Join(dir, "go.mod")); serr == nil {
			return dir, nil
		}
		if parent := filepath.Dir(dir); parent != dir {
			dir = parent
			continue
		}
		err = errors.New("no go.mod above the test's directory")
	}
	return "", err
}

// runChaos runs a chaos run, skipping the test only when this machine has
// no PostgreSQL server binaries to make a throwaway cluster with.
func runChaos(t *testing.T, o chaos.Options) *chaos.Result {
	t.Helper()
	o.Progress = testWriter{t}
	var out strings.Builder
	o.Out = &out
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := chaos.Run(ctx, o)
	if errors.Is(err, pgtemp.ErrNotInstalled) {
		t.Skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed: ", err)
	}
	require.NoError(t, err)
	t.Log("\n" + out.String())
	return res
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestChaosUnderEveryFaultBreaksNoPromise(t *testing.T) {
	bin, _ := build(t)
	res := runChaos(t, chaos.Options{Bin: bin, Duration: time.Minute})

	r := res.Report
	assert.Zero(t, r.Total(), "violations: %v\n%s", r.Counts, res.Summary)
	for _, f := range res.Faults {
		assert.Positive(t, f.Count, "no %s was injected: %s", f.Kind, res.Summary)
	}
	require.Len(t, res.Faults, 5, res.Summary)
	// The cuts reached the ingests: a proxy not in their way would cut
	// nothing and prove nothing.
	assert.Positive(t, res.PGCutConnections, "no pg_cut dropped or refused a connection: %s", res.Summary)
	assert.Positive(t, r.Commits, res.Summary)
	assert.Positive(t, r.StaleSends, "no writer sent after a takeover, so the fence was not tried: %s", res.Summary)
	assert.Greater(t, r.Grants, 2*chaos.PartitionsDefault, "takeovers happened: %s", res.Summary)
	// Side effects went both ways under the same faults: the runner
	// performed every committed intent, and the direct ones were fenced.
	assert.True(t, r.EffectsChecked, res.Summary)
	assert.Positive(t, r.Intents, res.Summary)
	assert.Positive(t, r.DirectEffects["applied"], res.Summary)
}

func TestChaosWithoutTheFenceReportsStaleCommits(t *testing.T) {
	bin, nofence := build(t)
	// Many tasks at a low rate: a writer that took over has not yet
	// written most tasks when the paused one wakes, so the zombie's next
	// versions are free, and only the fence can refuse them.
	res := runChaos(t, chaos.Options{Bin: bin, IngestBin: nofence, Duration: 25 * time.Second,
		Tasks: 64, Rate: 20, SigstopEvery: 2 * time.Second,
		KillIngestEvery: chaos.Off, NATSRestartEvery: chaos.Off, PGRestartEvery: chaos.Off, PGCutEvery: chaos.Off,
		GapWindow: 2 * time.Second, Show: 2})

	assert.Positive(t, res.Report.Counts[chaos.StaleCommit], "the checker missed what the fence prevents: %s", res.Summary)
	assert.NotEmpty(t, res.Dir, "a run with violations keeps its logs")
	if res.Dir != "" {
		os.RemoveAll(res.Dir)
	}
}

// The same schedule as the negative control, with the fence on but the
// run's partitions in the observe mode (docs/contract.md §13): the
// zombies' stale sends commit, each marked would_reject (the checker
// counts one that is not as a stale commit), and they are counted where an
// enforce run counts its stale refusals, of which there are none.
func TestChaosInObserveModeCountsWouldBeStaleCommits(t *testing.T) {
	bin, _ := build(t)
	res := runChaos(t, chaos.Options{Bin: bin, Duration: 15 * time.Second, FenceMode: chaos.FenceModeObserve,
		Tasks: 64, Rate: 20, SigstopEvery: 2 * time.Second,
		KillIngestEvery: chaos.Off, NATSRestartEvery: chaos.Off, PGRestartEvery: chaos.Off, PGCutEvery: chaos.Off,
		GapWindow: 2 * time.Second, Show: 2})

	r := res.Report
	assert.Zero(t, r.Total(), "violations: %v\n%s", r.Counts, res.Summary)
	assert.True(t, r.Observe, res.Summary)
	assert.Positive(t, r.StaleSends, "no writer sent after a takeover: %s", res.Summary)
	assert.Positive(t, r.WouldRejectStaleSends, "no stale send committed under observe: %s", res.Summary)
	total := 0
	for w, n := range r.WouldReject {
		assert.True(t, strings.HasPrefix(w, "stale/"), "would_reject %q", w)
		total += n
	}
	assert.GreaterOrEqual(t, total, r.WouldRejectStaleSends, "every stale send that committed is counted: %s", res.Summary)
	assert.Zero(t, r.Rejections["stale"], "observe refuses nothing as stale: %s", res.Summary)
	assert.Contains(t, res.Summary, "would_reject={", "the summary counts them")
}

// Against a deployment that is already running (here one StartDeployment
// made: its own PostgreSQL, nats-server, ingest and projector processes),
// only the writers and the checker run, as docs/operations.md tells a user
// to run them against theirs: SIGSTOPs of the writers still force
// takeovers, and the ledger breaks no promise.
func TestChaosAgainstAnExternalDeployment(t *testing.T) {
	bin, _ := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d, err := chaos.StartDeployment(ctx, chaos.DeploymentOptions{Bin: bin, Progress: testWriter{t}})
	if errors.Is(err, pgtemp.ErrNotInstalled) {
		t.Skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed: ", err)
	}
	require.NoError(t, err)
	defer func() { d.Stop(t.Failed()) }()

	// The negative control's shape (many tasks, a low rate): with an
	// unfenced ingest in the deployment this run reports stale commits.
	res := runChaos(t, chaos.Options{Bin: bin, Duration: 15 * time.Second, Partitions: 2, Tasks: 64, Rate: 20,
		SigstopEvery: 2 * time.Second,
		External: &chaos.External{Conn: connect.Options{DatabaseURL: d.DatabaseURL(), NATSURL: d.NATSURL()},
			FirstPartition: 5}})
	r := res.Report
	assert.Zero(t, r.Total(), "violations: %v\n%s", r.Counts, res.Summary)
	require.Len(t, res.Faults, 1, "against a deployment only the writers' SIGSTOP: %s", res.Summary)
	assert.Positive(t, res.Faults[0].Count, res.Summary)
	assert.Positive(t, r.Commits, res.Summary)
	assert.Greater(t, r.Grants, 2, "takeovers happened: %s", res.Summary)
	assert.Zero(t, d.Exits(), "a deployment's process exited")
}

// With -cluster: three JetStream nodes, R3 streams, and kill -9 of a node
// instead of the server's restart. A node kill is the fault that once made
// thousands of in-order events `gap` (issue 9); and the run must get past a
// cluster's start, whose first JetStream requests go unanswered until it
// has elected its meta leader. Each killed node comes back with its stream
// files' tail cut or a block corrupted (storage loss), which a replica can
// carry into leading a stream without any client's reconnect: log_order
// was 60 in a 3-minute run before each log copy named its predecessor's
// sequence (internal/ingest/order.go). This short run is no switch for
// that check: with it off, three runs passed. Its own tests are in
// internal/ingest (TestACopyWhosePredecessorTheStreamLostWaitsForItsPutBack).
func TestChaosOnAClusterBreaksNoPromise(t *testing.T) {
	bin, _ := build(t)
	res := runChaos(t, chaos.Options{Bin: bin, Duration: 25 * time.Second, Cluster: true,
		NATSRestartEvery: chaos.Off, StorageLossEvery: 6 * time.Second, Resend: 3 * time.Second,
		DrainTimeout: 30 * time.Second, KillIngestEvery: chaos.Off, PGRestartEvery: chaos.Off, PGCutEvery: chaos.Off})

	r := res.Report
	assert.Zero(t, r.Total(), "violations: %v\n%s", r.Counts, res.Summary)
	var losses int
	for _, f := range res.Faults {
		if f.Kind == chaos.FaultNATSLoss {
			losses = f.Count // each a node killed and restarted
		}
	}
	assert.Positive(t, losses, "no node was killed and lost storage: %s", res.Summary)
	assert.Positive(t, r.Commits, res.Summary)
}

// The NATS server is killed and comes back with the tail of every stream's
// files cut, as after a power loss within its sync interval: acknowledged
// events, log copies and projections are gone from JetStream. The writers
// re-send what got no receipt (as the SDK does), the ingest publishes the
// lost log copies again, the projector folds the lost projections from
// PostgreSQL, and the checker finds every promise kept. One loss, within
// the run's first 60%: the writers re-send for a while after it. With
// Resend 0 the events the loss took get no verdict, and the checker counts
// them lost (tried: lost=236).
//
// log_order was 3 and 4 in two of four runs while a batch holding a re-sent
// old version and a new one put back only the versions below the old one.
// Switch: in the ingest's precedingCopies look only at each task's first
// copy in the batch (internal/ingest/order.go): log_order 7 and 1 in two
// of two runs.
//
// The same again with log batches (ingest -log-batches): the lane whose
// chain the loss cut stores the partition's commits above its last link
// first. Switch: planLinks without its read of the rows above the top
// (internal/ingest/logchain.go): log_order 21.
func TestChaosWithNATSStorageLossBreaksNoPromise(t *testing.T) {
	for _, batches := range []bool{false, true} {
		t.Run(map[bool]string{false: "per-event copies", true: "log batches"}[batches], func(t *testing.T) {
			storageLoss(t, batches)
		})
	}
}

func storageLoss(t *testing.T, logBatches bool) {
	bin, _ := build(t)
	res := runChaos(t, chaos.Options{Bin: bin, Duration: 20 * time.Second, StorageLossEvery: time.Minute,
		Resend: 3 * time.Second, DrainTimeout: 30 * time.Second, LogBatches: logBatches,
		KillIngestEvery: chaos.Off, NATSRestartEvery: chaos.Off, PGRestartEvery: chaos.Off, PGCutEvery: chaos.Off})

	r := res.Report
	assert.Zero(t, r.Total(), "violations: %v\n%s", r.Counts, res.Summary)
	var losses int
	for _, f := range res.Faults {
		if f.Kind == chaos.FaultNATSLoss {
			losses = f.Count
		}
	}
	assert.Positive(t, losses, "no storage was lost: %s", res.Summary)
	assert.Positive(t, r.Commits, res.Summary)
}
