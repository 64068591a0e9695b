package benchreport

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/internal/lab/chaos"
	"github.com/flowness/ledger/internal/lab/procstat"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// ExternalOptions configure an external run ("ledgerlab bench -external").
// The zero value runs the defaults from the binaries beside the running
// executable.
type ExternalOptions struct {
	// Events is how many events the workers publish in all; default 50,000.
	Events int
	// Tasks is how many new tasks they spread over: 1..MaxTasks; default
	// one per 25 events, 16 to 2,000.
	Tasks int
	// Workers is how many worker processes publish, each holding an equal
	// share of the 16 partitions (partition p belongs to worker p mod
	// Workers); 1..16, default 4.
	Workers int
	// Raw makes the workers raw JetStream publishers (the contract's
	// headers, no SDK) instead of Go SDK clients.
	Raw bool
	// SDKBatchMax is the SDK clients' worker.Config.BatchMax: 1 sends
	// every event alone; default 0, the SDK's default (batches on).
	SDKBatchMax int
	// Bin is the directory holding the ingest, projector and ledgerlab
	// binaries; default the directory of the running executable.
	Bin string
	// LogBatches runs the ingest with -log-batches: one LEDGER_LOG message
	// per partition of a batch; default per-event copies.
	LogBatches bool
	// Roles runs the ingest and the projector as LOGIN users in
	// ledger_ingest and ledger_projector, as production does, so that the
	// database's own fence checks their statements; default the owner.
	Roles bool
	// IngestProfile, when set, is the file the ingest writes a CPU profile
	// of its whole life to (its -cpuprofile flag); default none.
	IngestProfile string
	// ProjectorProfile, when set, is the file the projector writes a CPU
	// profile of its whole life to (its -cpuprofile flag); default none.
	ProjectorProfile string
	// NATSProfile, when set, is the file the nats-server writes a CPU
	// profile of its whole life to; default none.
	NATSProfile string
	// WorkerProfile, when set, is the file worker 0 writes a CPU profile of
	// its whole life to (its share is the others' too); default none.
	WorkerProfile string
	// Progress receives the setup steps and a progress line; default
	// os.Stderr.
	Progress io.Writer
	// Warmup is how many events raw publishers send over tasks of their own
	// before the measured run starts, and the projector folds, so that the
	// run measures a worker starting on a running ledger, not the services'
	// own first second; default WarmupDefault, -1 none.
	Warmup int
	// Latency makes RunExternal a latency run (latencyRun): the workers
	// publish at Rate events a second, and each event's time to its receipt
	// is set beside the bare pipeline's publish → commit at the same rate.
	Latency bool
	// Rate is a latency run's offered load in events/s; 0 measures the
	// raw publishers' full-speed rate first and offers half of it.
	Rate int
}

// WithDefaults returns o with zero fields set to their defaults.
func (o ExternalOptions) WithDefaults() ExternalOptions {
	o.Events = cmp.Or(o.Events, EventsDefault)
	o.Tasks = cmp.Or(o.Tasks, taskCount(o.Events))
	o.Workers = cmp.Or(o.Workers, WorkersDefault)
	o.Warmup = cmp.Or(o.Warmup, WarmupDefault)
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	return o
}

func (o ExternalOptions) validate() error {
	switch {
	case o.Events < 1:
		return fmt.Errorf("benchreport: events must be at least 1, got %d", o.Events)
	case o.Tasks < 1 || o.Tasks > MaxTasks:
		return fmt.Errorf("benchreport: tasks must be 1..%d, got %d", MaxTasks, o.Tasks)
	case o.Workers < 1 || o.Workers > partitions:
		return fmt.Errorf("benchreport: workers must be 1..%d (one partition each at least), got %d", partitions, o.Workers)
	case o.Warmup < -1:
		return fmt.Errorf("benchreport: warm-up must be -1 (none), 0 (the default) or more events, got %d", o.Warmup)
	case o.Rate < 0:
		return fmt.Errorf("benchreport: rate must be 0 (half the saturation rate) or more, got %d", o.Rate)
	case o.Rate > 0 && !o.Latency:
		return fmt.Errorf("benchreport: a rate is for a latency run")
	}
	return nil
}

// The components of an external run, in the order the report lists them.
const (
	ComponentNATS      = "nats-server"
	ComponentIngest    = "ingest"
	ComponentProjector = "projector"
	ComponentWorkers   = "workers"
	ComponentPostgres  = "PostgreSQL"
)

// Component is one part of the deployment and what it cost over the
// measured window.
type Component struct {
	// Name is one of the Component* constants.
	Name string `json:"name"`
	// Processes is how many processes it is: for PostgreSQL the
	// postmaster and every child alive at the window's end.
	Processes int `json:"processes"`
	// CPU is its CPU time (user and system) over the window, read from
	// /proc/<pid>/stat before and after, in clock ticks of 10 ms.
	CPU time.Duration `json:"cpu_ns"`
	// PerEvent is CPU over the run's events.
	PerEvent time.Duration `json:"cpu_per_event_ns"`
	// PerCore is how many events a second one core of it carries at that
	// cost: events over CPU seconds.
	PerCore float64 `json:"events_per_core_second"`
}

// ExternalReport is the outcome of an external run.
type ExternalReport struct {
	Machine Machine `json:"machine"`
	// Events, Workers, Raw and Tasks are the load: Events events over
	// Tasks new tasks, published by Workers processes, raw or SDK.
	Events int `json:"events"`
	Tasks  int `json:"tasks"`
	// Warmup is how many events of other tasks went through the ledger
	// before the run (0: none).
	Warmup  int  `json:"warmup,omitempty"`
	Workers int  `json:"workers"`
	Raw     bool `json:"raw,omitempty"`
	// Roles is set when the ingest and the projector ran as users in
	// ledger_ingest and ledger_projector (ExternalOptions.Roles).
	Roles bool `json:"roles,omitempty"`
	// Receipt is from the first publish to the last commit receipt;
	// Projected to the moment the projector had acked every LEDGER_LOG
	// copy of the run (it acks once the value is in the bucket).
	Receipt   Row `json:"receipt"`
	Projected Row `json:"projected"`
	// Floor is the set-based fenced insert into a flat table on the
	// deployment's PostgreSQL after the run (LabelFloor); Receipt's and
	// Projected's Relative are their rates over it.
	Floor Row `json:"floor"`
	// FirstWindow and AfterFirstWindow split Receipt at FirstWindow after
	// the first publish (each worker counts from its own, which the
	// workers make within a few ms of each other): a slow start shows as
	// FirstWindow.Relative, its rate against the rest's, below 1. Both are
	// zero for a run shorter than two windows.
	FirstWindow      Row `json:"first_window"`
	AfterFirstWindow Row `json:"after_first_window"`
	// Components are the parts of the deployment, each with its CPU time
	// over the window from just before the first publish to the later of
	// the last receipt and the projector's last ack; Total is their sum.
	Components []Component `json:"components"`
	Total      Component   `json:"total"`
	// LoadBefore and LoadAfter are the machine's 1-minute load averages
	// before and after the window (-1 where unknown): other work on the
	// machine shows in the wall times, less in the CPU times.
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
	// IngestProfile is the ingest's CPU profile, when one was asked for.
	IngestProfile string `json:"ingest_profile,omitempty"`
	// ProjectorProfile is the projector's CPU profile, when one was asked
	// for.
	ProjectorProfile string `json:"projector_profile,omitempty"`
	// WorkerProfile is worker 0's CPU profile, when one was asked for.
	WorkerProfile string `json:"worker_profile,omitempty"`
	// Latency is a latency run's outcome; the rows above are then its
	// saturation run's, when it measured one.
	Latency *ExternalLatency `json:"latency,omitempty"`
	// Stages is the ingest's ledger_ingest_stage_seconds over a throughput
	// run's window: where an event's time to its receipt went.
	Stages []StageRow `json:"ingest_stages,omitempty"`
}

// ExternalLatency is the outcome of an external latency run.
type ExternalLatency struct {
	// Rate is the offered load, events/s; Saturation the raw publishers'
	// full-speed rate it is half of (0 when the rate was given).
	Rate       int     `json:"rate"`
	Saturation float64 `json:"saturation,omitempty"`
	// Path is publish → receipt through the ingest (raw or SDK), Bare
	// publish → commit through the bare pipeline; Path.Relative is its
	// p99 over Bare's.
	Path Row `json:"path"`
	Bare Row `json:"bare"`
	// Stages is the ingest's ledger_ingest_stage_seconds over the path's
	// phases: where the path's time to a receipt went.
	Stages []StageRow `json:"ingest_stages,omitempty"`
}

// projectorPoll is how often an external run asks for the projector's
// consumer: the resolution of the time to the projector, and a request
// the NATS server answers, counted in its CPU time (a few a second
// against thousands of events).
const projectorPoll = 25 * time.Millisecond

// RunExternal runs the ledger as a deployment runs it, every part a
// process of its own: a throwaway PostgreSQL with durable settings, one
// nats-server, one ingest, one projector (package chaos starts them) and
// Workers worker processes ("ledgerlab bench worker"). The workers take
// their leases and wait; then they publish Events events over new tasks at
// full speed and wait for every receipt, while the projector folds them
// into the bucket. It reads every process's CPU time just before the
// first publish and after the last receipt and the projector's last ack,
// and reports each component's CPU time per event.
func RunExternal(ctx context.Context, o ExternalOptions) (ExternalReport, error) {
	o = o.WithDefaults()
	if err := o.validate(); err != nil {
		return ExternalReport{}, err
	}
	prog := newProgress(o.Progress)
	defer prog.close()
	id := runID()
	load := "SDK"
	if o.Raw {
		load = "raw"
	}
	prog.say("run %s, external: %s events, %d %s worker processes", id, group(int64(o.Events)), o.Workers, load)
	do := chaos.DeploymentOptions{Bin: o.Bin, Progress: sayWriter{prog}, NoProjector: o.Latency, Roles: o.Roles}
	// The services run in directories of their own: profile paths are
	// made absolute.
	for _, p := range []struct {
		name string
		path *string
	}{{"ingest", &o.IngestProfile}, {"projector", &o.ProjectorProfile}, {"nats", &o.NATSProfile}, {"worker", &o.WorkerProfile}} {
		if *p.path == "" {
			continue
		}
		abs, err := filepath.Abs(*p.path)
		if err != nil {
			return ExternalReport{}, fmt.Errorf("benchreport: %s profile: %w", p.name, err)
		}
		*p.path = abs
	}
	if o.IngestProfile != "" {
		do.IngestArgs = []string{"-cpuprofile", o.IngestProfile}
	}
	if o.LogBatches {
		do.IngestArgs = append(do.IngestArgs, "-log-batches")
	}
	if o.ProjectorProfile != "" {
		do.ProjectorArgs = []string{"-cpuprofile", o.ProjectorProfile}
	}
	do.NATSProfile = o.NATSProfile
	d, err := chaos.StartDeployment(ctx, do)
	if err != nil {
		return ExternalReport{}, fmt.Errorf("benchreport: start the deployment: %w", err)
	}
	e := &external{o: o, id: id, d: d, prog: prog}
	var r ExternalReport
	if o.Latency {
		r, err = e.latencyRun(ctx)
	} else {
		r, err = e.run(ctx)
	}
	if n := d.Exits(); err == nil && n > 0 {
		err = fmt.Errorf("benchreport: %d service processes exited during the run", n)
	}
	if err != nil {
		d.Stop(true)
		return ExternalReport{}, fmt.Errorf("%w (logs in %s)", err, d.Dir())
	}
	d.Stop(false) // the ingest writes its profile as it stops
	r.IngestProfile, r.ProjectorProfile, r.WorkerProfile = o.IngestProfile, o.ProjectorProfile, o.WorkerProfile
	return r, nil
}

// sayWriter writes a chaos run log's lines as setup steps.
type sayWriter struct{ p *progress }

func (w sayWriter) Write(b []byte) (int, error) {
	for line := range strings.SplitSeq(strings.TrimRight(string(b), "\n"), "\n") {
		w.p.say("%s", strings.TrimPrefix(line, "chaos: "))
	}
	return len(b), nil
}

// external is an external run in progress.
type external struct {
	o    ExternalOptions
	id   string
	d    *chaos.Deployment
	prog *progress
}

// component is a measured part: its processes' roots.
type component struct {
	name string
	pids []int
}

func (e *external) run(ctx context.Context) (ExternalReport, error) {
	r := ExternalReport{Machine: machine(ctx, e.d.Pool(), true), Events: e.o.Events, Tasks: e.o.Tasks,
		Workers: e.o.Workers, Raw: e.o.Raw, Roles: e.o.Roles}
	var err error
	if r.Warmup, err = e.warmUp(ctx); err != nil {
		return r, err
	}
	comps, err := e.components(ctx)
	if err != nil {
		return r, err
	}
	ws, err := e.startWorkers(ctx, e.spec())
	defer ws.stop()
	if err != nil {
		return r, err
	}
	for i := range comps {
		if comps[i].name == ComponentWorkers {
			for _, w := range ws {
				comps[i].pids = append(comps[i].pids, w.cmd.Process.Pid)
			}
		}
	}
	js, err := jetstream.New(e.d.NATS())
	if err != nil {
		return r, err
	}
	target, err := logTarget(ctx, js, e.o.Events)
	if err != nil {
		return r, err
	}

	stagesBefore, stagesErr := scrapeStages(ctx, e.d.IngestAdmin())
	r.LoadBefore = procstat.LoadAverage()
	before, err := readProcSnapshot()
	if err != nil {
		return r, err
	}
	start := time.Now()
	for _, w := range ws {
		if _, err := io.WriteString(w.stdin, "go\n"); err != nil {
			return r, fmt.Errorf("benchreport: start worker %d: %w", w.n, err)
		}
	}
	results, projected, err := e.await(ctx, js, ws, target, start)
	if err != nil {
		return r, err
	}
	after, err := readProcSnapshot()
	if err != nil {
		return r, err
	}
	r.LoadAfter = procstat.LoadAverage()
	if stagesAfter, err := scrapeStages(ctx, e.d.IngestAdmin()); err == nil && stagesErr == nil {
		phase := map[string]stageHist{}
		for name, h := range stagesAfter {
			phase[name] = h.since(stagesBefore[name])
		}
		r.Stages = stageRows(phase)
	}

	first, last, events, inFirst := int64(0), int64(0), 0, 0
	for _, l := range results {
		events += l.Events
		inFirst += l.InFirstWindow
		if l.Events > 0 {
			first = minNonZero(first, l.FirstPublish)
			last = max(last, l.LastReceipt)
		}
	}
	if events != e.o.Events {
		return r, fmt.Errorf("benchreport: the workers published %d events, %d were asked for", events, e.o.Events)
	}
	run := time.Unix(0, last).Sub(time.Unix(0, first))
	r.Receipt = throughputRow("first publish → last receipt", events, run)
	r.FirstWindow, r.AfterFirstWindow = splitAtWindow(inFirst, events, run)
	if !projected.IsZero() {
		r.Projected = throughputRow("first publish → projector acked all", events, projected.Sub(time.Unix(0, first)))
	}
	if r.Components, err = costs(before, after, comps, events); err != nil {
		return r, err
	}
	r.Total = total(r.Components, events)
	if r.Floor, err = e.floor(ctx); err != nil {
		return r, err
	}
	relativeToFloor(&r.Receipt, r.Floor)
	relativeToFloor(&r.Projected, r.Floor)
	return r, nil
}

// splitAtWindow splits a run of events receipts over run into the
// inFirst that arrived in its first FirstWindow and the rest, and compares
// their rates; both rows are zero for a run shorter than two windows.
func splitAtWindow(inFirst, events int, run time.Duration) (first, rest Row) {
	if run < 2*FirstWindow {
		return Row{}, Row{}
	}
	name := "first second" // FirstWindow
	first = throughputRow(name, inFirst, FirstWindow)
	rest = throughputRow("after the "+name, events-inFirst, run-FirstWindow)
	if rest.PerSecond > 0 {
		first.Relative, first.RelativeTo = first.PerSecond/rest.PerSecond, "the rest"
	}
	return first, rest
}

func minNonZero(a, b int64) int64 {
	if a == 0 {
		return b
	}
	return min(a, b)
}

// components lists the deployment's parts but the workers, whose processes
// are not started yet: PostgreSQL is the tree under the postmaster, the
// parent of any backend.
func (e *external) components(ctx context.Context) ([]component, error) {
	procs, err := e.d.Processes()
	if err != nil {
		return nil, err
	}
	byName := map[string]int{}
	for _, p := range procs {
		byName[p.Name] = p.PID
	}
	var backend int
	if err := e.d.Pool().QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return nil, fmt.Errorf("benchreport: find PostgreSQL's processes: %w", err)
	}
	st, err := procstat.ReadProcess(backend)
	if err != nil {
		return nil, fmt.Errorf("benchreport: find PostgreSQL's postmaster: %w", err)
	}
	postmaster := st.PPID
	comps := []component{
		{name: ComponentNATS, pids: []int{byName["nats-server"]}},
		{name: ComponentIngest, pids: []int{byName["ingest"]}},
	}
	if pid, ok := byName["projector"]; ok {
		comps = append(comps, component{name: ComponentProjector, pids: []int{pid}})
	}
	return append(comps, component{name: ComponentWorkers}, component{name: ComponentPostgres, pids: []int{postmaster}}), nil
}

// costs is each component's CPU time between two snapshots, over events.
func costs(before, after procSnapshot, comps []component, events int) ([]Component, error) {
	out := make([]Component, 0, len(comps))
	for _, c := range comps {
		var cpu time.Duration
		n := 0
		for _, pid := range c.pids {
			t0, _, err := before.treeCPU(pid)
			if err != nil {
				return nil, fmt.Errorf("benchreport: %s before the run: %w", c.name, err)
			}
			t1, k, err := after.treeCPU(pid)
			if err != nil {
				return nil, fmt.Errorf("benchreport: %s after the run: %w", c.name, err)
			}
			if t1 < t0 {
				return nil, fmt.Errorf("benchreport: %s: CPU time went back from %v to %v", c.name, t0, t1)
			}
			cpu += t1 - t0
			n += k
		}
		out = append(out, newComponent(c.name, n, cpu, events))
	}
	return out, nil
}

// newComponent describes a part that spent cpu on events.
func newComponent(name string, processes int, cpu time.Duration, events int) Component {
	c := Component{Name: name, Processes: processes, CPU: cpu}
	if events > 0 {
		c.PerEvent = cpu / time.Duration(events)
	}
	if cpu > 0 {
		c.PerCore = float64(events) / cpu.Seconds()
	}
	return c
}

// total sums the components.
func total(cs []Component, events int) Component {
	var cpu time.Duration
	n := 0
	for _, c := range cs {
		cpu += c.CPU
		n += c.Processes
	}
	return newComponent("all", n, cpu, events)
}

// logTarget is the LEDGER_LOG sequence the projector will have acked once
// it has folded events more commits in: one log copy per commit.
func logTarget(ctx context.Context, js jetstream.JetStream, events int) (uint64, error) {
	st, err := js.Stream(ctx, wire.StreamLog)
	if err != nil {
		return 0, fmt.Errorf("benchreport: stream %s: %w", wire.StreamLog, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("benchreport: stream %s: %w", wire.StreamLog, err)
	}
	return info.State.LastSeq + uint64(events), nil
}

// await waits for every worker's done line and for the projector to ack
// LEDGER_LOG up to target (with log batches, the log's end once every
// worker is done), and returns the lines and when the projector
// got there. It fails when a worker fails or when neither the workers nor
// the projector made progress for ReceiptTimeout.
func (e *external) await(ctx context.Context, js jetstream.JetStream, ws workers, target uint64,
	start time.Time) ([]workerLine, time.Time, error) {
	var cons jetstream.Consumer
	base := target - uint64(e.o.Events)
	var acked atomic.Int64
	if !e.o.Latency { // a latency run has no projector
		cfg, err := streams.Consumer("projector", streams.Options{})
		if err != nil {
			return nil, time.Time{}, err
		}
		if cons, err = js.Consumer(ctx, wire.StreamLog, cfg.Durable); err != nil {
			return nil, time.Time{}, fmt.Errorf("benchreport: the projector's consumer: %w", err)
		}
		e.prog.begin("external: projected", e.o.Events, acked.Load)
		defer e.prog.end()
	}

	lines := make(chan workerResult, len(ws))
	for _, w := range ws {
		go func() { lines <- w.result() }()
	}
	results := make([]workerLine, 0, len(ws))
	var projected time.Time
	var last int64 = -1
	since := time.Now()
	tick := time.NewTicker(projectorPoll)
	defer tick.Stop()
	for len(results) < len(ws) || (projected.IsZero() && !e.o.Latency) {
		select {
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		case res := <-lines:
			if res.err != nil {
				return nil, time.Time{}, res.err
			}
			results = append(results, res.line)
			since = time.Now()
			if len(results) == len(ws) && e.o.LogBatches && !e.o.Latency {
				// Every event has its receipt, so its link is stored: the
				// log ends here. Links hold several commits each, so the
				// target counted one message per commit is too far.
				var err error
				if target, err = logTarget(ctx, js, 0); err != nil {
					return nil, time.Time{}, err
				}
			}
			continue
		case <-tick.C:
		}
		now := time.Now()
		if projected.IsZero() && !e.o.Latency {
			info, err := cons.Info(ctx)
			if err != nil {
				return nil, time.Time{}, fmt.Errorf("benchreport: the projector's consumer: %w", err)
			}
			now = time.Now()
			floor := max(int64(info.AckFloor.Stream)-int64(base), 0)
			acked.Store(floor)
			batchesDone := !e.o.LogBatches || len(results) == len(ws)
			if info.AckFloor.Stream >= target && info.NumAckPending == 0 && batchesDone {
				projected = now
			}
			if floor != last {
				last, since = floor, now
			}
		}
		if now.Sub(since) > ReceiptTimeout {
			return nil, time.Time{}, fmt.Errorf("benchreport: neither the workers nor the projector made progress for %v "+
				"(projector at %d of %d events, %d of %d workers done)", ReceiptTimeout, acked.Load(), e.o.Events, len(results), len(ws))
		}
	}
	return results, projected, nil
}

// workerProc is one worker process.
type workerProc struct {
	n       int
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   *bufio.Scanner
	logPath string
	exited  chan struct{}
}

type workers []*workerProc

type workerResult struct {
	line workerLine
	err  error
}

// workerSpec is what a set of worker processes is to do: the run id their
// tasks and holders are named by, how many they are, the events they
// publish in all, raw or through the SDK or as the bare pipeline, and at
// what rate (0: full speed).
type workerSpec struct {
	id           string
	workers      int
	events, rate int
	raw, bare    bool
	tasks        int
}

// spec is the throughput run's workers.
func (e *external) spec() workerSpec {
	return workerSpec{id: e.id, workers: e.o.Workers, events: e.o.Events, tasks: e.o.Tasks, raw: e.o.Raw}
}

// startWorkers starts the worker processes and waits until each holds its
// leases.
func (e *external) startWorkers(ctx context.Context, sp workerSpec) (workers, error) {
	lab := e.d.Ledgerlab()
	var ws workers
	for n := range sp.workers {
		w, err := e.startWorker(lab, sp, n)
		if err != nil {
			return ws, err
		}
		ws = append(ws, w)
	}
	// Acquiring a lease takes a round trip to the ledger; a minute is a
	// worker that will not get there.
	rctx, cancel := context.WithTimeout(ctx, 2*ReceiptTimeout)
	defer cancel()
	for _, w := range ws {
		if err := w.ready(rctx); err != nil {
			return ws, err
		}
	}
	e.prog.say("%d worker processes hold their leases", len(ws))
	return ws, nil
}

func (e *external) startWorker(lab string, sp workerSpec, n int) (*workerProc, error) {
	args := []string{"bench", "worker", "-nats-url", e.d.NATSURL(), "-run", sp.id, "-worker", strconv.Itoa(n),
		"-workers", strconv.Itoa(sp.workers), "-events", strconv.Itoa(sp.events), "-tasks", strconv.Itoa(sp.tasks)}
	if sp.raw {
		args = append(args, "-raw")
	}
	if sp.rate > 0 {
		args = append(args, "-rate", strconv.Itoa(sp.rate))
	}
	if sp.bare {
		args = append(args, "-bare", "-database-url", e.d.DatabaseURL())
	}
	if e.o.SDKBatchMax > 0 {
		args = append(args, "-sdk-batch", strconv.Itoa(e.o.SDKBatchMax))
	}
	if e.o.WorkerProfile != "" && n == 0 && !sp.bare {
		args = append(args, "-cpuprofile", e.o.WorkerProfile)
	}
	w := &workerProc{n: n, cmd: exec.Command(lab, args...), exited: make(chan struct{}),
		logPath: filepath.Join(e.d.Dir(), "procs", fmt.Sprintf("worker-%s-%d.log", sp.id, n))}
	logf, err := os.Create(w.logPath)
	if err != nil {
		return nil, fmt.Errorf("benchreport: worker %d log: %w", n, err)
	}
	w.cmd.Stderr = logf
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		logf.Close()
		return nil, err
	}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	w.lines = bufio.NewScanner(out)
	w.lines.Buffer(make([]byte, 0, 512), maxWorkerLine)
	if err := w.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("benchreport: start worker %d (%s): %w", n, lab, err)
	}
	go func() {
		_ = w.cmd.Wait()
		logf.Close()
		close(w.exited)
	}()
	return w, nil
}

// next reads the worker's next line.
func (w *workerProc) next() (workerLine, error) {
	if !w.lines.Scan() {
		<-w.exited
		return workerLine{}, fmt.Errorf("benchreport: worker %d stopped (%v): %s", w.n, w.cmd.ProcessState, w.logTail())
	}
	l, err := decodeWorkerLine(w.lines.Bytes())
	if err != nil {
		return workerLine{}, fmt.Errorf("benchreport: worker %d: %w", w.n, err)
	}
	return l, nil
}

// ready waits for the worker's ready line.
func (w *workerProc) ready(ctx context.Context) error {
	got := make(chan workerResult, 1)
	go func() {
		l, err := w.next()
		got <- workerResult{l, err}
	}()
	select {
	case <-ctx.Done():
		return fmt.Errorf("benchreport: worker %d not ready: %w", w.n, ctx.Err())
	case res := <-got:
		if res.err == nil && res.line.State != workerReady {
			res.err = fmt.Errorf("benchreport: worker %d said %q before it was ready", w.n, res.line.State)
		}
		return res.err
	}
}

// result reads the worker's done line.
func (w *workerProc) result() workerResult {
	l, err := w.next()
	if err == nil && l.State != workerDone {
		err = fmt.Errorf("benchreport: worker %d said %q instead of done", w.n, l.State)
	}
	return workerResult{l, err}
}

// logTail is the end of the worker's log, to say why it stopped.
func (w *workerProc) logTail() string {
	b, err := os.ReadFile(w.logPath)
	if err != nil {
		return "no log: " + err.Error()
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	if s == "" {
		return "nothing logged"
	}
	return s
}

// stop ends the workers: stdin closes, they release their leases and exit;
// one that does not within 15 s is killed.
func (ws workers) stop() {
	for _, w := range ws {
		_ = w.stdin.Close()
	}
	for _, w := range ws {
		select {
		case <-w.exited:
		case <-time.After(15 * time.Second):
			_ = w.cmd.Process.Kill()
			<-w.exited
		}
	}
}
