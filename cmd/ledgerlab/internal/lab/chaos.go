package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/lab/chaos"
	"github.com/flowness/ledger/pkg/wire"
)

// chaosCommands are the parts of a chaos run that are processes of their
// own. "writer" and "check" also run against an existing deployment
// (docs/operations.md); "nats" is what a run starts as its NATS server.
var chaosCommands = map[string]Command{
	"writer": {ChaosWriter, "-holder H -partition N -tasks N -task-prefix P -log FILE [flags]", "one writer of a chaos run"},
	"check":  {ChaosCheck, "-logs DIR [-show N]", "check the ledger against writer logs"},
	"nats":   {ChaosNATS, "-name N -port P -store DIR [-cluster C -cluster-port P -routes URLS]", "a NATS server node of a chaos run"},
	"failover": {ChaosFailover, "[-ttls 500ms,1s,3s,10s] [-pauses 100ms,...] [-trials N] [-pause-trials N] [-json]",
		"measure failover time after kill -9 and false takeovers after pauses, per lease TTL"},
}

// Chaos runs a chaos run ("chaos"), one of its parts ("chaos writer",
// "chaos check", "chaos nats"), or the failover measurement ("chaos
// failover").
func Chaos(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// A part's name comes first after the global flags; anything else is
	// the run's own flags.
	fs := NewFlags("ledgerlab chaos", "", "", io.Discard)
	if err := fs.FlagSet.Parse(args); err == nil && fs.NArg() > 0 {
		if _, ok := chaosCommands[fs.Arg(0)]; ok {
			return dispatch(ctx, "ledgerlab chaos", chaosCommands, args, stdout, stderr)
		}
	}
	return chaosRun(ctx, args, stdout, stderr)
}

// violationsError is a run or check that found violations: exit status 1,
// the violations already printed.
type violationsError struct{ n int }

func (e violationsError) Error() string { return fmt.Sprintf("%d violations (see above)", e.n) }

func chaosRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerlab chaos", "[flags]",
		"Run the ledger as processes (PostgreSQL, NATS, two ingests, a projector) with two writers per\n"+
			"partition, inject faults while they publish (SIGSTOP of a writer, kill -9 of an ingest, NATS\n"+
			"and PostgreSQL restarts), then check from the writers' logs and the stored state that no\n"+
			"promise was broken. Exit status 0: no violation; 1: violations (printed); 2: usage.\n"+
			"With -external, run only the writers and the checker against DATABASE_URL and NATS_URL.\n"+
			"Parts: 'ledgerlab chaos writer', 'ledgerlab chaos check' (see docs/operations.md).", stderr)
	var o chaos.Options
	f.DurationVar(&o.Duration, "duration", chaos.DurationDefault, "how long the writers publish")
	f.IntVar(&o.Partitions, "partitions", chaos.PartitionsDefault, "partitions written")
	f.IntVar(&o.Writers, "writers", chaos.WritersDefault, "writers per partition, each the others' standby")
	f.IntVar(&o.Tasks, "tasks", chaos.TasksDefault, "tasks per partition")
	f.DurationVar(&o.TTL, "ttl", chaos.WriterTTLDefault, "the writers' lease TTL (also the ingests' -lease-ttl)")
	f.Float64Var(&o.Rate, "rate", chaos.RateDefault, "events per second of a writer while it holds its lease")
	f.DurationVar(&o.Zombie, "zombie", chaos.ZombieDefault, "how long a writer that was paused keeps publishing with its old generation")
	for _, ft := range chaos.Faults {
		if ft.Flag != "" {
			f.DurationVar(ft.Every(&o), ft.Flag, ft.FlagDefault(), ft.Usage)
		}
	}
	f.StringVar(&o.Replication, "replication", "", "run PostgreSQL as a primary and a streaming standby, sync or async, on one multi-host URL, and fail it over (-pg-failover-every) instead of -pg-restart-every and -pg-cut-every")
	f.BoolVar(&o.LogBatches, "log-batches", false, "run the ingests with -log-batches: one LEDGER_LOG message per partition of a batch")
	f.BoolVar(&o.Roles, "roles", false, "run the ingests and the projector as users in ledger_ingest and ledger_projector, as production does, so that the database's own fence checks them (default: the schema's owner)")
	f.BoolVar(&o.SplitBrain, "split-brain", false, "with -replication: start the old primary again, writable, for 5 s after each failover")
	f.DurationVar(&o.Resend, "resend", 0, "writers publish again an acked event with no receipt after this long (the SDK's re-send); 0: never")
	f.StringVar(&o.Writer, "writer", chaos.WriterRaw, "how the writers publish: raw (JetStream itself) or sdk (the Go SDK, pkg/worker, which re-sends by itself)")
	f.DurationVar(&o.ReceiptTimeout, "receipt-timeout", chaos.SDKReceiptTimeoutDefault, "with -writer sdk: the SDK's receipt timeout (its lookup and re-send of an event without receipt)")
	f.BoolVar(&o.Cluster, "cluster", false, "three JetStream nodes and R3 streams; kill -9 of a node instead of the server's restart")
	f.IntVar(&o.Ingests, "ingests", chaos.IngestsDefault, "ingest processes")
	f.StringVar(&o.Principal, "principal", chaos.PrincipalDefault, "principal of the writers' holder ids (with -external: their NATS user)")
	seed := f.Uint64("seed", 0, "seed of the fault schedule and victims (0: random, printed)")
	f.StringVar(&o.Bin, "bin", "", "directory of the ingest, projector, ledgerctl and ledgerlab binaries (default: this executable's)")
	f.StringVar(&o.Dir, "dir", "", "keep the run's logs and data here (default: a temporary directory, removed after a clean run)")
	f.DurationVar(&o.GapWindow, "gap-window", 0, "the ingests' -gap-window (0: their default, 30s)")
	f.DurationVar(&o.GapTimeout, "gap-timeout", chaos.GapTimeoutDefault, "the projector's -gap-timeout")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", chaos.DrainTimeoutDefault, "longest wait for LEDGER_IN to empty and the projections to catch up")
	f.DurationVar(&o.RestoreWait, "restore-wait", chaos.RestoreWaitDefault, "with -replication async: longest wait after a failover for an ingest to report the commits the database forgot, before the run restores them")
	f.IntVar(&o.Show, "show", chaos.ShowDefault, "offenders printed per kind of violation")
	f.StringVar(&o.FenceMode, "fence-mode", chaos.FenceModeEnforce, "the fence mode of the run's partitions: enforce, or observe (stale sends commit, marked would_reject, and are counted where enforce counts its stale refusals)")
	external := f.Bool("external", false, "write to the deployment at DATABASE_URL and NATS_URL; no faults but the writers' SIGSTOP")
	firstPartition := f.Int("first-partition", 0, "with -external: the first of the run's partitions (nobody else may lease them)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	o.Seed = *seed
	chaos.ZeroIsOff(&o)
	if o.Resend == 0 {
		o.Resend = chaos.Off
	}
	if *external {
		o.External = &chaos.External{Conn: f.Conn, Prefix: f.Prefix, FirstPartition: *firstPartition}
		if f.Conn.DatabaseURL == "" {
			return Usagef("-external needs DATABASE_URL (or -database-url)")
		}
	} else if f.Prefix != wire.PrefixDefault {
		return Usagef("-prefix applies to -external runs; a run of its own uses %q", wire.PrefixDefault)
	}
	// The flags hold the defaults already: a zero typed here is a mistake,
	// not a request for the default.
	if err := o.Validate(); err != nil {
		return Usagef("%v", err)
	}
	o.Out, o.Progress = stdout, stderr
	res, err := chaos.Run(ctx, o)
	if err != nil {
		return err
	}
	if res.Report.Total() > 0 {
		return violationsError{res.Report.Total()}
	}
	return nil
}

// ChaosWriter runs one writer ("chaos writer") until it is interrupted.
func ChaosWriter(ctx context.Context, args []string, _, stderr io.Writer) error {
	f := NewFlags("ledgerlab chaos writer", "-holder H -partition N -tasks N -task-prefix P -log FILE [flags]",
		"Compete for a partition's lease and, while holding it, publish the next versions of the\n"+
			"partition's tasks (<task-prefix>-t0 ... -t<N-1>), logging every publish, ack, receipt and\n"+
			"grant to -log (JSON lines, read by 'ledgerlab chaos check'). Runs until interrupted.", stderr)
	var cfg chaos.WriterConfig
	f.StringVar(&cfg.Holder, "holder", "", "holder id, <principal>.<instance> (required)")
	f.IntVar(&cfg.Partition, "partition", -1, "partition (required)")
	tasks := f.Int("tasks", chaos.TasksDefault, "number of tasks")
	taskPrefix := f.String("task-prefix", "", "task ids are <task-prefix>-t<i> (required)")
	f.DurationVar(&cfg.TTL, "ttl", chaos.WriterTTLDefault, "lease TTL")
	f.Float64Var(&cfg.Rate, "rate", chaos.WriterRateDefault, "events per second while holding the lease")
	f.DurationVar(&cfg.Zombie, "zombie", chaos.ZombieDefault, "how long to keep publishing with the old generation after a pause; 0: not at all")
	f.DurationVar(&cfg.Resend, "resend", 0, "publish again an acked event with no receipt after this long; 0: never")
	kind := f.String("writer", chaos.WriterRaw, "raw (JetStream itself) or sdk (the Go SDK, pkg/worker)")
	f.DurationVar(&cfg.ReceiptTimeout, "receipt-timeout", chaos.SDKReceiptTimeoutDefault, "with -writer sdk: the SDK's receipt timeout")
	logPath := f.String("log", "", "writer log file to create (required)")
	downstream := f.String("downstream-url", "", "downstream database to perform each checkpoint's effect on directly, fenced; empty: none")
	if err := f.Parse(args); err != nil {
		return err
	}
	if *downstream != "" {
		pool, err := pgxpool.New(ctx, *downstream)
		if err != nil {
			return fmt.Errorf("downstream database: %w", err)
		}
		defer pool.Close()
		cfg.Downstream = pool
	}
	if cfg.Zombie == 0 {
		cfg.Zombie = chaos.Off
	}
	if cfg.Holder == "" || cfg.Partition < 0 || *taskPrefix == "" || *logPath == "" || *tasks < 1 {
		return Usagef("-holder, -partition, -tasks, -task-prefix and -log are required")
	}
	cfg.Prefix = f.Prefix
	for i := range *tasks {
		cfg.Tasks = append(cfg.Tasks, *taskPrefix+"-t"+strconv.Itoa(i))
	}
	logFile, err := os.OpenFile(*logPath, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("writer log: %w", err)
	}
	defer logFile.Close()
	cfg.Log = logFile
	opts, err := f.Conn.NATSOptions(nil)
	if err != nil {
		return Usagef("%v", err)
	}
	// Replies come under the principal's own inbox prefix, the only one an
	// authenticated worker may subscribe to (docs/contract.md §9).
	opts = append(opts, nats.Name(cfg.Holder), nats.CustomInboxPrefix(wire.InboxPrefix(wire.Principal(cfg.Holder))),
		nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	nc, err := nats.Connect(f.Conn.NATSURL, opts...)
	if err != nil {
		return fmt.Errorf("NATS: %w", connect.RedactError(f.Conn.NATSURL, err))
	}
	defer nc.Close()
	run := chaos.RunWriter
	switch *kind {
	case chaos.WriterRaw:
	case chaos.WriterSDK:
		run = chaos.RunSDKWriter
	default:
		return Usagef("-writer must be %s or %s, got %q", chaos.WriterRaw, chaos.WriterSDK, *kind)
	}
	if err := run(ctx, nc, cfg); err != nil {
		return err
	}
	return logFile.Sync()
}

// ChaosCheck checks the ledger against writer logs ("chaos check").
func ChaosCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerlab chaos check", "-logs DIR [-show N]",
		"Read the writer logs (*.jsonl) in -logs and what PostgreSQL (DATABASE_URL), LEDGER_LOG,\n"+
			"LEDGER_DLQ and the bucket (NATS_URL) hold for their tasks, and report every violation.\n"+
			"Run it once the writers stopped and the ledger has judged their events.", stderr)
	dir := f.String("logs", "", "directory of the writer logs (required)")
	show := f.Int("show", chaos.ShowDefault, "offenders printed per kind of violation")
	if err := f.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return Usagef("-logs is required")
	}
	logs, err := chaos.ReadLogs(*dir)
	if err != nil {
		return err
	}
	pool, err := f.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, js, err := f.JetStream()
	if err != nil {
		return err
	}
	defer nc.Close()
	h, err := chaos.Collect(ctx, chaos.Sources{Pool: pool, JS: js, Prefix: f.Prefix}, logs)
	if err != nil {
		return err
	}
	r := chaos.Check(h)
	chaos.PrintViolations(stdout, h, r, *show)
	fmt.Fprintln(stdout, chaos.CheckLine(r))
	if r.Total() > 0 {
		return violationsError{r.Total()}
	}
	return nil
}

// ChaosNATS runs one NATS server node of a chaos run ("chaos nats") until
// it is interrupted.
func ChaosNATS(ctx context.Context, args []string, _, stderr io.Writer) error {
	f := NewFlags("ledgerlab chaos nats", "-name N -port P -store DIR [-cluster C -cluster-port P -routes URLS] [-sync-always]",
		"Run an embedded nats-server with JetStream until interrupted: the NATS node a chaos run\n"+
			"starts, kills and restarts (on the same port and store).", stderr)
	var n chaos.NATSNode
	f.StringVar(&n.Name, "name", "", "server name")
	f.IntVar(&n.Port, "port", 0, "client port on 127.0.0.1")
	f.StringVar(&n.StoreDir, "store", "", "JetStream store directory")
	f.StringVar(&n.Cluster, "cluster", "", "cluster name (empty: standalone)")
	f.IntVar(&n.ClusterPort, "cluster-port", 0, "route port on 127.0.0.1")
	f.StringVar(&n.Routes, "routes", "", "route URLs of every node, comma separated")
	f.BoolVar(&n.SyncAlways, "sync-always", false, "fsync every JetStream write before acknowledging it (sync_interval: always)")
	f.StringVar(&n.CPUProfile, "cpuprofile", "", "write a CPU profile of the node's whole life to this file as it stops")
	if err := f.Parse(args); err != nil {
		return err
	}
	if n.Name == "" || n.Port <= 0 || n.StoreDir == "" {
		return Usagef("-name, -port and -store are required")
	}
	return chaos.RunNATS(ctx, n)
}

// ChaosFailover measures failover time and false takeovers per lease TTL
// ("chaos failover").
func ChaosFailover(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerlab chaos failover", "[-ttls 500ms,1s,3s,10s] [-pauses 100ms,250ms,500ms,1s,2s] [-trials N] [-pause-trials N] [flags]",
		"For each TTL, start PostgreSQL (a throwaway cluster), NATS and one ingest as processes, and two\n"+
			"writers of one partition, each the other's standby, renewing every TTL/3 by the SDK's rule. Then\n"+
			"kill -9 the holder -trials times, measuring from the kill to the standby's first committed event,\n"+
			"and SIGSTOP the holder for each pause -pause-trials times, counting the pauses after which the\n"+
			"other writer was granted the partition (false takeovers: the holder was alive). Prints the\n"+
			"tables (or -json) and what a renewal costs PostgreSQL. See docs/operations.md.", stderr)
	ttls := f.String("ttls", durationList(chaos.FailoverTTLsDefault), "lease TTLs to measure, comma separated")
	pauses := f.String("pauses", durationList(chaos.PausesDefault), "pause lengths (SIGSTOP), comma separated")
	var o chaos.FailoverOptions
	f.IntVar(&o.Trials, "trials", chaos.FailoverTrialsDefault, "kill -9 trials per TTL")
	f.IntVar(&o.PauseTrials, "pause-trials", chaos.PauseTrialsDefault, "SIGSTOP trials per TTL and pause")
	f.Float64Var(&o.Rate, "rate", chaos.FailoverRateDefault, "events per second of the holding writer")
	seed := f.Uint64("seed", 0, "seed of where in the renewal cycle each fault lands (0: random, printed)")
	f.StringVar(&o.Bin, "bin", "", "directory of the ingest, projector, ledgerctl and ledgerlab binaries (default: this executable's)")
	f.StringVar(&o.Dir, "dir", "", "keep the logs and data here (default: a temporary directory, kept only after an error or a missed failover)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	var err error
	if o.TTLs, err = chaos.ParseDurations(*ttls); err != nil {
		return Usagef("-ttls: %v", err)
	}
	if o.Pauses, err = chaos.ParseDurations(*pauses); err != nil {
		return Usagef("-pauses: %v", err)
	}
	o.Seed = *seed
	// The flags hold the defaults already: a zero typed here is a mistake.
	if err := o.Validate(); err != nil {
		return Usagef("%v", err)
	}
	o.Progress = stderr
	rep, err := chaos.RunFailover(ctx, o)
	if err != nil {
		return err
	}
	if f.JSON {
		return writeJSON(stdout, rep)
	}
	return chaos.PrintFailover(stdout, rep)
}

func durationList(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ",")
}
