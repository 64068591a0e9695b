package chaos

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/internal/pgtemp"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker/effect"
)

// Result is the outcome of a run.
type Result struct {
	// Report is what the checker found.
	Report *Report
	// History is what it read.
	History *History
	// Faults counts the faults injected, by kind.
	Faults []FaultCount
	// Exits counts service processes that exited without a fault killing
	// them (each was restarted).
	Exits int
	// PGCutConnections counts the ingests' PostgreSQL connections the
	// pg_cut faults dropped or refused: a cut that reached no connection
	// proved nothing.
	PGCutConnections int64
	// PGFailovers are the PostgreSQL failovers injected (Replication), in
	// order.
	PGFailovers []PGFailover
	// Summary is the run's summary line.
	Summary string
	// Dir is where the run's logs are; empty once removed.
	Dir string
}

// ErrMissingBinary is returned when a service binary is not where a run
// looks for it.
var ErrMissingBinary = errors.New("binary not found")

// run is one chaos run in progress.
type run struct {
	o      Options
	id     string
	dir    string
	start  time.Time
	runLog io.WriteCloser
	bin    struct{ ingest, projector, ledgerctl, ledgerlab string }
	prefix string
	first  int // first partition
	pg     *pgtemp.Cluster
	dbURL  string
	// standby is pg's streaming standby (Replication), downPG the
	// downstream's own server then, and standbys the number made so far.
	standby  *pgtemp.Cluster
	downPG   *pgtemp.Cluster
	standbys int
	// forgetful, failovers and superseded are what the failovers did:
	// the windows the database could forget in, each failover's figures,
	// and what an old primary took after it came back.
	forgetful   [][2]int64
	failovers   []PGFailover
	superseded  History
	ingestPorts []int
	// guard keeps the run's own pool off an old primary (Replication):
	// the checker must read the newest one.
	guard *fence.PrimaryGuard
	// pgProxies[i] carries ingest i's connections to PostgreSQL (the
	// pg_cut fault); none against an external deployment.
	pgProxies []*faultproxy.Proxy
	natsURL   string
	nodes     []*proc
	ingests   []*proc
	proj      *proc
	writers   []*proc
	// holderOf maps a writer's holder id to its process.
	holderOf map[string]*proc
	// noProjector leaves the projector out (a failover measurement reads
	// only PostgreSQL).
	noProjector bool
	pool        *pgxpool.Pool
	nc          *nats.Conn
	js          jetstream.JetStream
	// downURL and down are the downstream database of the run's side
	// effects, and effects the runner that performs the committed intents
	// (none against an external deployment).
	downURL    string
	down       *pgxpool.Pool
	effects    *effect.Runner
	effectsLog *os.File

	mu     sync.Mutex
	rng    *rand.Rand
	faults map[string]int
	// storageLosses counts loseNATSStorage faults, to alternate their kind.
	storageLosses int
	exits         int
}

// Run runs a chaos run: it starts PostgreSQL, NATS, the ingests, the
// projector and the writers as processes (or, with External, only the
// writers), injects faults while the writers publish, stops the faults and
// the writers, waits until the ledger has judged what it holds and the
// projections caught up, and checks the history. It prints the violations
// and the summary line to o.Out. The error is about the run itself; the
// violations are in the result's Report.
func Run(ctx context.Context, o Options) (*Result, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	r := newRun(o)
	if o.External != nil {
		r.first = o.External.FirstPartition
		if o.External.Prefix != "" {
			r.prefix = o.External.Prefix
		}
	}
	if o.Seed == 0 {
		o.Seed = randomSeed()
		r.o.Seed = o.Seed
	}
	r.rng = seeded(o.Seed)
	if err := r.findBinaries(); err != nil {
		return nil, err
	}
	keep := o.Dir != ""
	if err := r.makeDir(); err != nil {
		return nil, err
	}
	r.logf("run %s, seed %d, in %s", r.id, o.Seed, r.dir)
	res, err := r.execute(ctx)
	r.runLog.Close()
	if err != nil {
		return nil, fmt.Errorf("%w (logs in %s)", err, r.dir)
	}
	if res.Report.Total() == 0 && !keep {
		os.RemoveAll(r.dir)
		res.Dir = ""
	}
	return res, nil
}

// execute runs the phases; whatever happens, everything started is
// stopped before it returns.
func (r *run) execute(ctx context.Context) (*Result, error) {
	defer r.teardown()
	if err := r.startStack(ctx); err != nil {
		return nil, err
	}
	if err := r.startEffects(ctx); err != nil {
		return nil, err
	}
	if err := r.setFenceModes(ctx); err != nil {
		return nil, err
	}
	if err := r.startWriters(); err != nil {
		return nil, err
	}
	r.logf("writers publishing for %v", r.o.Duration)
	r.start = time.Now()
	faultCtx, stopFaults := context.WithCancel(ctx)
	var wg sync.WaitGroup
	r.startFaults(faultCtx, &wg)
	select {
	case <-ctx.Done():
	case <-time.After(r.o.Duration):
	}
	stopFaults()
	wg.Wait()
	r.logf("faults stopped; stopping the writers")
	r.stopWriters()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("chaos: run interrupted: %w", err)
	}
	h, report, err := r.drainAndCheck(ctx)
	if err != nil {
		return nil, err
	}
	res := &Result{Report: report, History: h, Faults: r.faultCounts(), Exits: r.exitCount(), Dir: r.dir,
		PGFailovers: r.failovers}
	for _, p := range r.pgProxies {
		res.PGCutConnections += p.Dropped() + p.Refused()
	}
	if len(r.pgProxies) > 0 {
		r.logf("pg_cut: %d ingest connections to PostgreSQL dropped or refused", res.PGCutConnections)
	}
	res.Summary = SummaryLine(r.o.Duration, report, res.Faults, res.Exits)
	PrintViolations(r.o.Out, h, report, r.o.Show)
	if report.Total() > 0 {
		fmt.Fprintf(r.o.Out, "chaos: logs and data kept in %s\n", r.dir)
	}
	fmt.Fprintln(r.o.Out, res.Summary)
	_, _ = fmt.Fprintln(r.runLog, res.Summary)
	return res, nil
}

// setFenceModes puts the run's partitions in the observe fence mode when
// the run asks for it; enforce is every partition's default.
func (r *run) setFenceModes(ctx context.Context) error {
	if r.o.FenceMode != FenceModeObserve {
		return nil
	}
	for p := r.first; p < r.first+r.o.Partitions; p++ {
		if _, err := fence.SetFenceMode(ctx, r.pool, p, FenceModeObserve, "ledger-chaos", "chaos run "+r.id+" in observe"); err != nil {
			return fmt.Errorf("chaos: put partition %d in observe: %w", p, err)
		}
	}
	r.logf("partitions %d..%d in the observe fence mode", r.first, r.first+r.o.Partitions-1)
	return nil
}

// newRun is a run of o, nothing started yet.
func newRun(o Options) *run {
	return &run{o: o, id: runID(), faults: map[string]int{}, holderOf: map[string]*proc{}, prefix: wire.PrefixDefault}
}

// randomSeed is a seed for a run that was given none: random, never 0.
func randomSeed() uint64 {
	var b [8]byte
	_, _ = cryptorand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) | 1
}

// seeded is the random source of seed: the same seed, the same numbers.
func seeded(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// runID names a run: its tasks and holders start with it.
func runID() string {
	var b [5]byte
	_, _ = cryptorand.Read(b[:])
	return "c" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

func (r *run) findBinaries() error {
	bin := r.o.Bin
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("chaos: find the binaries: %w", err)
		}
		bin = filepath.Dir(exe)
	}
	r.bin.ingest, r.bin.projector, r.bin.ledgerctl = filepath.Join(bin, "ingest"), filepath.Join(bin, "projector"), filepath.Join(bin, "ledgerctl")
	r.bin.ledgerlab = filepath.Join(bin, "ledgerlab")
	if r.o.IngestBin != "" {
		r.bin.ingest = r.o.IngestBin
	}
	if r.o.Ledgerlab != "" {
		r.bin.ledgerlab = r.o.Ledgerlab
	}
	// ledgerlab runs the writers and NATS; ledgerctl plays the operator.
	need := []string{r.bin.ledgerlab}
	if r.o.External == nil {
		need = append(need, r.bin.ingest, r.bin.projector, r.bin.ledgerctl)
	}
	for _, p := range need {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%w: %s (build them with 'go build -o bin/ ./cmd/...' and pass -bin bin, or run 'make chaos')", ErrMissingBinary, p)
		}
	}
	return nil
}

func (r *run) makeDir() error {
	dir := r.o.Dir
	var err error
	if dir == "" {
		dir, err = os.MkdirTemp("", "ledger-chaos-")
	} else {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return fmt.Errorf("chaos: work directory: %w", err)
	}
	r.dir = dir
	for _, sub := range []string{"logs", "procs", "nats"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return fmt.Errorf("chaos: work directory: %w", err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, "run.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("chaos: run log: %w", err)
	}
	r.runLog = f
	return nil
}

// logf writes a line of the run log, stamped with the time since the
// writers started (or the wall clock before that).
func (r *run) logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamp := time.Now().UTC().Format("15:04:05.000")
	if !r.start.IsZero() {
		stamp = fmt.Sprintf("%7.2fs", time.Since(r.start).Seconds())
	}
	line := fmt.Sprintf("%s %s\n", stamp, fmt.Sprintf(format, args...))
	_, _ = io.WriteString(r.o.Progress, "chaos: "+line)
	if r.runLog != nil {
		_, _ = io.WriteString(r.runLog, line)
	}
}

func (r *run) uniform(lo, hi float64) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return lo + r.rng.Float64()*(hi-lo)
}

func (r *run) pick(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rng.IntN(n)
}

func (r *run) onExit(p *proc, err error) {
	r.mu.Lock()
	r.exits++
	r.mu.Unlock()
	r.logf("%s exited without being killed (%v); restarting it", p.name, err)
}

func (r *run) exitCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exits
}

func (r *run) newProc(name, path string, args ...string) *proc {
	return newProc(name, path, filepath.Join(r.dir, "procs", name+".log"), r.onExit, args...)
}

// startStack starts PostgreSQL, NATS, the ingests and the projector, or
// connects to the external deployment.
func (r *run) startStack(ctx context.Context) error {
	if ext := r.o.External; ext != nil {
		r.dbURL = ext.Conn.DatabaseURL
		return r.connect(ctx, func() (*nats.Conn, error) { return ext.Conn.NATS(nil) })
	}
	if r.o.Replication != "" {
		if err := r.startReplicated(ctx); err != nil {
			return err
		}
	} else {
		pg, err := pgtemp.StartWith(ctx, pgtemp.Options{Durable: true})
		if err != nil {
			return fmt.Errorf("chaos: start PostgreSQL: %w", err)
		}
		r.pg, r.dbURL = pg, pg.URL()
		r.logf("PostgreSQL: a throwaway cluster in %s", pg.Dir())
	}
	if err := r.startNATS(ctx); err != nil {
		return err
	}
	if err := r.connect(ctx, func() (*nats.Conn, error) {
		return nats.Connect(r.natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Name("chaos"))
	}); err != nil {
		return err
	}
	replicas := "1"
	if r.o.Cluster {
		replicas = "3"
	}
	ports, err := freePorts(r.o.Ingests + 1)
	if err != nil {
		return err
	}
	r.ingestPorts = ports[:r.o.Ingests]
	ingestAs, projectorAs := func(u string) (string, error) { return u, nil }, r.dbURL
	if r.o.Roles {
		if err := serviceUsers(ctx, r.dbURL); err != nil {
			return err
		}
		ingestAs = func(u string) (string, error) { return urlAs(u, ingestUser) }
		if projectorAs, err = urlAs(r.dbURL, projectorUser); err != nil {
			return err
		}
		r.logf("the ingests and the projector connect as users in ledger_ingest and ledger_projector")
	}
	for i := range r.o.Ingests {
		// Each ingest reaches PostgreSQL through a proxy of its own (the
		// pg_cut fault), unless the run fails PostgreSQL over: then through
		// the multi-host URL.
		dbURL := r.dbURL
		if r.o.Replication == "" {
			proxy, err := faultproxy.New("unix", r.pg.Socket())
			if err != nil {
				return fmt.Errorf("chaos: proxy to PostgreSQL: %w", err)
			}
			r.pgProxies = append(r.pgProxies, proxy)
			dbURL = "postgres://postgres@" + proxy.Addr() + "/postgres?sslmode=disable"
		}
		if dbURL, err = ingestAs(dbURL); err != nil {
			return err
		}
		args := []string{"-database-url", dbURL, "-nats-url", r.natsURL, "-partitions", strconv.Itoa(r.o.Partitions),
			"-lease-ttl", r.o.TTL.String(), "-replicas", replicas, "-admin-addr", fmt.Sprintf("127.0.0.1:%d", ports[i])}
		if r.o.GapWindow > 0 {
			args = append(args, "-gap-window", r.o.GapWindow.String())
		}
		if r.o.LogBatches {
			args = append(args, "-log-batches")
		}
		if r.o.Roles {
			args = append(args, "-migrate=false")
		}
		p := r.newProc(fmt.Sprintf("ingest-%d", i+1), r.bin.ingest, args...)
		r.ingests = append(r.ingests, p)
		if err := p.start(); err != nil {
			return err
		}
		// The first one migrates and creates the streams.
		if err := waitReady(ctx, ports[i], p); err != nil {
			return err
		}
	}
	if r.noProjector {
		r.logf("%d ingest(s) ready", r.o.Ingests)
		return nil
	}
	r.proj = r.newProc("projector", r.bin.projector, "-database-url", projectorAs, "-nats-url", r.natsURL,
		"-partition-count", strconv.Itoa(r.o.Partitions), "-replicas", replicas, "-gap-timeout", r.o.GapTimeout.String(),
		"-reconcile-every", reconcileEvery.String(), "-reconcile-grace", reconcileGrace.String(),
		"-admin-addr", fmt.Sprintf("127.0.0.1:%d", ports[r.o.Ingests]))
	if err := r.proj.start(); err != nil {
		return err
	}
	if err := waitReady(ctx, ports[r.o.Ingests], r.proj); err != nil {
		return err
	}
	if r.o.Roles {
		for _, user := range []string{ingestUser, projectorUser} {
			if err := connectedAs(ctx, r.pool, user); err != nil {
				return err
			}
		}
	}
	r.logf("%d ingests and a projector ready", r.o.Ingests)
	return nil
}

// startNATS starts the NATS server, or three cluster nodes, as processes
// of "ledgerlab chaos nats".
func (r *run) startNATS(ctx context.Context) error {
	n := 1
	if r.o.Cluster {
		n = 3
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		return err
	}
	var urls, routes []string
	for i := range n {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i]))
	}
	r.natsURL = strings.Join(urls, ",")
	for i := range n {
		name := fmt.Sprintf("nats-%d", i+1)
		args := []string{"chaos", "nats", "-name", name, "-port", strconv.Itoa(ports[i]),
			"-store", filepath.Join(r.dir, "nats", name)}
		if r.o.NATSSyncAlways {
			args = append(args, "-sync-always")
		}
		if f := r.o.NATSProfile; f != "" {
			if n > 1 {
				f = fmt.Sprintf("%s.%d", f, i+1)
			}
			args = append(args, "-cpuprofile", f)
		}
		if r.o.Cluster {
			args = append(args, "-cluster", "chaos-"+r.id, "-cluster-port", strconv.Itoa(ports[n+i]),
				"-routes", strings.Join(routes, ","))
		}
		p := r.newProc(name, r.bin.ledgerlab, args...)
		r.nodes = append(r.nodes, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	r.logf("NATS: %d node(s) at %s", n, r.natsURL)
	return nil
}

// connect opens the run's own connections, and waits until JetStream
// answers (a cluster has elected its meta leader).
func (r *run) connect(ctx context.Context, dial func() (*nats.Conn, error)) error {
	cfg, err := pgxpool.ParseConfig(r.dbURL)
	if err != nil {
		return fmt.Errorf("chaos: database URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "ledger-chaos"
	if r.o.Replication != "" {
		r.guard = &fence.PrimaryGuard{}
		fence.GuardPool(cfg, r.guard)
	}
	if r.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return fmt.Errorf("chaos: database: %w", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		// Each try starts afresh: an error of the last try's JetStream
		// request must not stand for this one's (a cluster that had no
		// meta leader yet then looked unanswering for good).
		err = nil
		if r.nc == nil {
			r.nc, err = dial()
		}
		if err == nil {
			if r.js, err = jetstream.New(r.nc); err == nil {
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err = r.js.AccountInfo(actx)
				cancel()
			}
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("chaos: JetStream at %s did not answer within 60s: %w", r.natsURL, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitReady waits until a service's /readyz answers 200.
func waitReady(ctx context.Context, port int, p *proc) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", port)
	deadline := time.Now().Add(90 * time.Second)
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("chaos: %s is not ready after 90s (see %s)", p.name, p.logPath)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startEffects creates the downstream database and starts the effect
// runner on it, unless the run writes to an external deployment.
func (r *run) startEffects(ctx context.Context) error {
	if r.o.External != nil {
		return nil
	}
	var err error
	admin, adminURL := r.pool, r.dbURL
	if r.downPG != nil {
		adminURL = r.downPG.URL()
		if admin, err = pgxpool.New(ctx, adminURL); err != nil {
			return fmt.Errorf("chaos: the downstream's PostgreSQL: %w", err)
		}
		defer admin.Close()
	}
	if r.downURL, r.down, err = setupDownstream(ctx, admin, adminURL); err != nil {
		return err
	}
	if r.effectsLog, err = os.Create(filepath.Join(r.dir, "procs", "effects.log")); err != nil {
		return fmt.Errorf("chaos: effect runner log: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(r.effectsLog, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if r.effects, err = startEffectRunner(ctx, r.js, r.down, r.prefix, log); err != nil {
		return err
	}
	r.logf("effect runner ready: downstream database %q", downstreamDB)
	return nil
}

// startWriters starts Writers writer processes per partition.
func (r *run) startWriters() error {
	for p := r.first; p < r.first+r.o.Partitions; p++ {
		for k := range r.o.Writers {
			if _, err := r.startWriter(p, k); err != nil {
				return err
			}
		}
	}
	return nil
}

// startWriter starts writer k of partition p.
func (r *run) startWriter(p, k int) (*proc, error) {
	var args []string
	if ext := r.o.External; ext != nil {
		args = externalConnArgs(ext)
	} else {
		args = []string{"-nats-url", r.natsURL}
	}
	zombie := r.o.Zombie.String()
	if r.o.Zombie == Off {
		zombie = "0" // the writer's word for none
	}
	holder := wire.Holder(r.o.Principal, fmt.Sprintf("%s-p%d-w%d", r.id, p, k))
	args = append([]string{"chaos", "writer"}, args...)
	args = append(args, "-prefix", r.prefix, "-holder", holder, "-partition", strconv.Itoa(p),
		"-tasks", strconv.Itoa(r.o.Tasks), "-task-prefix", fmt.Sprintf("%s-p%d", r.id, p),
		"-ttl", r.o.TTL.String(), "-rate", strconv.FormatFloat(r.o.Rate, 'f', -1, 64),
		"-zombie", zombie, "-log", r.writerLog(holder))
	if r.downURL != "" {
		args = append(args, "-downstream-url", r.downURL)
	}
	if r.o.Resend > 0 {
		args = append(args, "-resend", r.o.Resend.String())
	}
	if r.o.Writer == WriterSDK {
		args = append(args, "-writer", WriterSDK, "-receipt-timeout", r.o.ReceiptTimeout.String())
	}
	w := r.newProc(holder, r.bin.ledgerlab, args...)
	w.onExit = func(p *proc, err error) {
		r.onExit(p, err)
		p.close() // a writer is not restarted: its log would begin again
	}
	r.writers = append(r.writers, w)
	r.holderOf[holder] = w
	return w, w.start()
}

// writerLog is where a writer logs.
func (r *run) writerLog(holder string) string {
	return filepath.Join(r.dir, "logs", holder+".jsonl")
}

// externalConnArgs passes a deployment's NATS settings on to the writers.
func externalConnArgs(ext *External) []string {
	var args []string
	c := ext.Conn
	for _, kv := range [][2]string{{"-nats-url", c.NATSURL}, {"-nats-user", c.NATSUser}, {"-nats-password", c.NATSPassword},
		{"-nats-creds", c.NATSCreds}, {"-nats-nkey", c.NATSNKey}, {"-nats-ca", c.NATSCA}, {"-nats-cert", c.NATSCert},
		{"-nats-key", c.NATSKey}} {
		if kv[1] != "" {
			args = append(args, kv[0], kv[1])
		}
	}
	return args
}

func (r *run) stopWriters() {
	var wg sync.WaitGroup
	for _, w := range r.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.close()
			if err := w.stop(15 * time.Second); err != nil {
				r.logf("%v", err)
			}
		}()
	}
	wg.Wait()
}

// drainAndCheck waits until the ledger has judged everything it holds and
// the projections caught up, bounded by DrainTimeout, and checks.
func (r *run) drainAndCheck(ctx context.Context) (*History, *Report, error) {
	logs, err := ReadLogs(filepath.Join(r.dir, "logs"))
	if err != nil {
		return nil, nil, err
	}
	src := Sources{Pool: r.pool, JS: r.js, Prefix: r.prefix, Downstream: r.down}
	collect := func() (*History, error) {
		h, err := Collect(ctx, src, logs)
		if err == nil {
			r.mu.Lock()
			h.SupersededEvents, h.SupersededGrants = r.superseded.SupersededEvents, r.superseded.SupersededGrants
			h.Forgetful = r.forgetful
			r.mu.Unlock()
		}
		return h, err
	}
	deadline := time.Now().Add(r.o.DrainTimeout)
	waited := time.Now()
	for {
		pending, holder := r.inboundPending(ctx), wire.StreamIn
		if pending == 0 && r.effects != nil {
			var state string
			pending, state = effectsPending(ctx, r.js)
			holder = "the effect runner (" + state + ")"
		}
		var h *History
		var rep *Report
		if pending == 0 {
			if h, err = collect(); err == nil {
				rep = Check(h)
				if rep.Counts[Lost] == 0 && rep.Counts[ProjectionDiffers] == 0 && rep.Counts[IntentWithoutEffect] == 0 {
					r.logf("drained in %v", time.Since(waited).Round(100*time.Millisecond))
					return h, rep, nil
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if h == nil {
				// The last word: whatever the ledger holds now.
				if h, err = collect(); err != nil {
					return nil, nil, err
				}
				rep = Check(h)
			}
			r.logf("not drained after %v: %s holds %d messages (%d of LEDGER_IN's before its consumers' positions); checking what there is",
				r.o.DrainTimeout, holder, pending, r.inboundBehind(ctx))
			if holder == wire.StreamIn && pending > 0 {
				r.dumpIngests()
			}
			return h, rep, nil
		}
		time.Sleep(time.Second)
	}
}

// dumpIngests has every running ingest print its goroutines into its log
// and exit (SIGQUIT): where an ingest that stopped deciding waits.
func (r *run) dumpIngests() {
	for _, p := range r.ingests {
		if p.running() && p.signal(syscall.SIGQUIT) == nil {
			r.logf("SIGQUIT to %s: its goroutines are at the end of procs/%s.log", p.name, p.name)
		}
	}
}

// inboundPending is how many messages LEDGER_IN still holds (-1 if it
// cannot tell); a deployment of others is not waited for (0).
func (r *run) inboundPending(ctx context.Context) int64 {
	if r.o.External != nil {
		return 0
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := r.js.Stream(sctx, wire.StreamIn)
	if err != nil {
		return -1
	}
	return int64(s.CachedInfo().State.Msgs)
}

// inboundBehind is how many LEDGER_IN messages no consumer will deliver:
// the stream's count less what its consumers have pending or unacked
// (messages a storage loss brought back below their ack floors).
func (r *run) inboundBehind(ctx context.Context) int64 {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := r.js.Stream(sctx, wire.StreamIn)
	if err != nil {
		return -1
	}
	n := int64(s.CachedInfo().State.Msgs)
	infos := s.ListConsumers(sctx)
	for info := range infos.Info() {
		n -= int64(info.NumPending) + int64(info.NumAckPending)
	}
	if infos.Err() != nil {
		return -1
	}
	return n
}

// teardown stops everything the run started.
func (r *run) teardown() {
	all := append(append(append([]*proc{}, r.writers...), r.ingests...), r.nodes...)
	if r.proj != nil {
		all = append(all, r.proj)
	}
	for _, p := range all {
		p.close()
	}
	for _, w := range r.writers {
		w.kill()
	}
	stopAll := func(ps []*proc) {
		var wg sync.WaitGroup
		for _, p := range ps {
			wg.Add(1)
			go func() { defer wg.Done(); _ = p.stop(10 * time.Second) }()
		}
		wg.Wait()
	}
	if r.proj != nil {
		stopAll([]*proc{r.proj})
	}
	stopAll(r.ingests)
	for _, p := range r.pgProxies {
		p.Close()
	}
	if r.effects != nil {
		r.effects.Stop()
	}
	if r.effectsLog != nil {
		r.effectsLog.Close()
	}
	if r.down != nil {
		r.down.Close()
	}
	if r.nc != nil {
		r.nc.Close()
	}
	if r.pool != nil {
		r.pool.Close()
	}
	stopAll(r.nodes)
	if r.pg != nil {
		if b, err := os.ReadFile(r.pg.LogFile()); err == nil {
			_ = os.WriteFile(filepath.Join(r.dir, "procs", "postgres.log"), b, 0o644)
		}
		r.pg.Stop()
	}
	for _, c := range []*pgtemp.Cluster{r.standby, r.downPG} {
		if c != nil {
			r.keepLog(c)
			c.Stop()
		}
	}
}

// A run's projector compares the task heads with the projections every
// second, and counts one behind after 5 s (its defaults are 5 s and 30 s):
// what a storage loss took from the bucket is folded again before the
// checker reads it.
const (
	reconcileEvery = time.Second
	reconcileGrace = 5 * time.Second
)
