package chaos

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// Defaults of Options.
const (
	// DurationDefault is how long the writers publish under faults: 60 s.
	DurationDefault = time.Minute
	// PartitionsDefault is the number of partitions written: 6, so that
	// one principal sends over 1,000 events a second (each holding writer
	// waits for its publishes' acks).
	PartitionsDefault = 6

	// FenceModeEnforce and FenceModeObserve are the fence modes a run
	// puts its partitions in (Options.FenceMode).
	FenceModeEnforce = fence.ModeEnforce
	FenceModeObserve = fence.ModeObserve
	// WritersDefault is the number of writers per partition, each the
	// others' standby: 2.
	WritersDefault = 2
	// TasksDefault is the number of tasks per partition: 10. At the
	// default rate each task takes about 30 versions a second: hot tasks,
	// the shape that once turned two ingests' in-order events into gaps.
	TasksDefault = 10
	// RateDefault is the events per second a holding writer aims at in a
	// run: 400. A writer waits for each publish's ack (and makes every
	// intent's direct effect), so it reaches about 250 a second on 2 CPUs,
	// and one principal about 1,200 over the default six partitions.
	RateDefault = 400
	// IngestsDefault is the number of ingest processes: 2.
	IngestsDefault = 2
	// SigstopEveryDefault is the mean time between two SIGSTOPs of a
	// writer: 4 s.
	SigstopEveryDefault = 4 * time.Second
	// KillIngestEveryDefault is the mean time between two kill -9 of an
	// ingest: 10 s.
	KillIngestEveryDefault = 10 * time.Second
	// NATSRestartEveryDefault is the mean time between two NATS restarts
	// (with Cluster: kills of a node): 30 s.
	NATSRestartEveryDefault = 30 * time.Second
	// PGRestartEveryDefault is the mean time between two immediate-mode
	// PostgreSQL restarts: 30 s.
	PGRestartEveryDefault = 30 * time.Second
	// PGCutEveryDefault is the mean time between two cuts of the network
	// between an ingest and PostgreSQL: 20 s.
	PGCutEveryDefault = 20 * time.Second
	// GapTimeoutDefault is the projector's -gap-timeout in a run: 1 s
	// instead of 5 s, so a projection a fault left waiting is re-fetched
	// well within the drain.
	GapTimeoutDefault = time.Second
	// DrainTimeoutDefault bounds the wait, after the writers stopped, for
	// LEDGER_IN to empty and the projections to catch up: 90 s.
	DrainTimeoutDefault = 90 * time.Second
	// ShowDefault is how many offenders of each kind are printed: 5.
	ShowDefault = 5
	// PrincipalDefault is the principal of the writers' holder ids:
	// "chaos".
	PrincipalDefault = "chaos"
)

// Off, as a fault's interval, disables that fault.
const Off time.Duration = -1

// Options configure a chaos run. The zero value runs the defaults; the
// interval of a fault is its mean time between two injections (each drawn
// from ±25% of it, the first within the run's first 60%), and Off disables
// it.
type Options struct {
	// Duration is how long the writers publish; default 60 s.
	Duration time.Duration
	// Partitions is how many partitions are written; default 6.
	Partitions int
	// Writers is the number of writers per partition; default 2.
	Writers int
	// Tasks is the number of tasks per partition; default 10.
	Tasks int
	// TTL is the writers' lease TTL; default 1 s.
	TTL time.Duration
	// Rate is the events per second of a holding writer; default 400.
	Rate float64
	// Zombie is how long a woken writer keeps publishing with its old
	// generation; default 300 ms, Off for not at all.
	Zombie time.Duration
	// SigstopEvery: SIGSTOP of a writer (the holder of a random
	// partition) for 1.25 to 2 TTLs, then SIGCONT; default 4 s.
	SigstopEvery time.Duration
	// KillIngestEvery: kill -9 of a random ingest, restarted 0.5 to 2 s
	// later; default 10 s.
	KillIngestEvery time.Duration
	// NATSRestartEvery: kill -9 of the NATS server, restarted 1 s later
	// (with Cluster, of a random node, restarted 2 to 5 s later); default
	// 30 s.
	NATSRestartEvery time.Duration
	// PGRestartEvery: PostgreSQL stopped in immediate mode and started
	// again; default 30 s.
	PGRestartEvery time.Duration
	// PGCutEvery: the network between a random ingest and PostgreSQL cut
	// (its connections dropped, new ones refused; PostgreSQL and the other
	// ingest go on) for 1 to 3 s; default 20 s. Each ingest reaches
	// PostgreSQL through a TCP proxy of the run's (internal/faultproxy).
	PGCutEvery time.Duration
	// Replication runs the ledger's PostgreSQL as a primary and a
	// streaming standby, ReplicationSync or ReplicationAsync, reached
	// through one multi-host URL, and injects PGFailoverEvery instead of
	// PGRestartEvery and PGCutEvery; default "" (one server).
	Replication string
	// PGFailoverEvery: kill -9 of every process of the primary and the
	// standby promoted, then a new standby made (pgfailover.go); with
	// ReplicationAsync the standby is first frozen behind and a holder
	// paused past its TTL. Default 30 s, with Replication only.
	PGFailoverEvery time.Duration
	// SplitBrain starts the old primary again after each failover,
	// writable, for 5 s, while every service connects anew.
	SplitBrain bool
	// StorageLossEvery: kill -9 of the NATS server (with Cluster, of a
	// random node), the newest block file of every stream cut short, as a
	// power loss does to writes not yet synced, and a restart 1 s later;
	// with Cluster, every other time a block in the middle of a stream's
	// files on that one node is corrupted instead. Default Off.
	StorageLossEvery time.Duration
	// Resend makes the writers publish again, with its id, an event acked
	// by JetStream that has no receipt this long after its ack (the
	// SDK's re-send); default Off. A storage loss needs it: an acked
	// event the server lost is not published again otherwise.
	Resend time.Duration
	// Writer is how the writers reach the ledger: WriterRaw (default), or
	// WriterSDK, the Go SDK (writer_sdk.go), which needs no Resend.
	Writer string
	// ReceiptTimeout is the SDK writers' receipt timeout; default
	// SDKReceiptTimeoutDefault (2 s).
	ReceiptTimeout time.Duration
	// Cluster runs three JetStream nodes and R3 streams.
	Cluster bool
	// NATSSyncAlways runs the nodes with sync_interval: always.
	NATSSyncAlways bool
	// NATSProfile, when set, is the file each NATS node writes a CPU
	// profile of its whole life to (a cluster's node i to NATSProfile.i).
	NATSProfile string
	// Ingests is the number of ingest processes; default 2.
	Ingests int
	// Principal is the principal of the writers' holder ids,
	// <principal>.<run>-p<partition>-w<k>; default "chaos". Against an
	// authenticated deployment it is the writers' NATS user.
	Principal string
	// Seed fixes the fault schedule and victims; 0 picks one (printed).
	Seed uint64
	// Bin is the directory holding the ingest, projector, ledgerctl and
	// ledgerlab binaries; default the directory of the running executable.
	Bin string
	// IngestBin overrides Bin/ingest (the negative control's build).
	IngestBin string
	// Ledgerlab overrides Bin/ledgerlab, which runs the writers and the
	// NATS nodes.
	Ledgerlab string
	// Dir keeps the run's logs and data; default a temporary directory,
	// removed after a run without violations.
	Dir string
	// GapWindow is the ingest's -gap-window; 0 keeps its default (30 s).
	GapWindow time.Duration
	// LogBatches runs the ingests with -log-batches: LEDGER_LOG holds one
	// message per partition of a batch; default per-event copies.
	LogBatches bool
	// Roles runs the ingests and the projector as LOGIN users in
	// ledger_ingest and ledger_projector, as production does, so that the
	// database's own fence checks every statement they send; default the
	// schema's owner, for whom it checks nothing.
	Roles bool
	// GapTimeout is the projector's -gap-timeout; default 1 s.
	GapTimeout time.Duration
	// DrainTimeout bounds the wait for LEDGER_IN to empty and the
	// projections to catch up; default 90 s.
	DrainTimeout time.Duration
	// RestoreWait bounds the wait, after an asynchronous failover, for an
	// ingest to report that the database forgot acknowledged commits;
	// default 1 min (on a loaded machine that took more than 10 s once in
	// an hour's run). A run whose ingest has no such check (the negative
	// control's) waits it out.
	RestoreWait time.Duration
	// FenceMode is the fence mode the run puts its partitions in before the
	// writers start (docs/contract.md §13): FenceModeEnforce (default) or
	// FenceModeObserve, where the checker counts the would-be-stale
	// commits (Report.WouldReject) where an enforce run counts its stale
	// refusals, and requires each stale send that commits to say so.
	FenceMode string
	// Show is how many offenders of each kind are printed; default 5.
	Show int
	// Out receives the violations and the summary line; default discards.
	Out io.Writer
	// Progress receives the run log as it happens; default discards.
	Progress io.Writer
	// External runs the writers and the checker against a deployment that
	// is already running, and injects no faults but the writers' SIGSTOP.
	External *External
}

// External is a deployment a run writes to.
type External struct {
	// Conn holds its PostgreSQL and NATS connection settings.
	Conn connect.Options
	// Prefix is its subject prefix; default "ledger".
	Prefix string
	// FirstPartition is the first of the run's partitions; they must exist
	// in the deployment and be leased by nobody else.
	FirstPartition int
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	o.Duration = cmp.Or(o.Duration, DurationDefault)
	o.TTL = cmp.Or(o.TTL, WriterTTLDefault)
	o.Zombie = cmp.Or(o.Zombie, ZombieDefault)
	for _, f := range Faults {
		p := f.every(&o)
		*p = cmp.Or(*p, f.Default)
	}
	o.Resend = cmp.Or(o.Resend, Off)
	o.Writer = cmp.Or(o.Writer, WriterRaw)
	o.ReceiptTimeout = cmp.Or(o.ReceiptTimeout, SDKReceiptTimeoutDefault)
	o.GapTimeout = cmp.Or(o.GapTimeout, GapTimeoutDefault)
	o.DrainTimeout = cmp.Or(o.DrainTimeout, DrainTimeoutDefault)
	o.RestoreWait = cmp.Or(o.RestoreWait, RestoreWaitDefault)
	o.Partitions = cmp.Or(o.Partitions, PartitionsDefault)
	o.FenceMode = cmp.Or(o.FenceMode, FenceModeEnforce)
	o.Writers = cmp.Or(o.Writers, WritersDefault)
	o.Tasks = cmp.Or(o.Tasks, TasksDefault)
	o.Ingests = cmp.Or(o.Ingests, IngestsDefault)
	o.Principal = cmp.Or(o.Principal, PrincipalDefault)
	o.Rate = cmp.Or(o.Rate, RateDefault)
	o.Show = cmp.Or(o.Show, ShowDefault)
	// Not cmp.Or: comparing interfaces panics on a writer whose type is
	// not comparable.
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// Validate reports the first setting that cannot run.
func (o Options) Validate() error {
	switch {
	case o.Duration <= 0:
		return errors.New("the duration must be positive")
	case o.Roles && o.External != nil:
		return errors.New("-roles starts the services itself: it does not apply to -external")
	case o.FenceMode != FenceModeEnforce && o.FenceMode != FenceModeObserve:
		return fmt.Errorf("fence mode must be %s or %s, got %q", FenceModeEnforce, FenceModeObserve, o.FenceMode)
	case o.Partitions < 1 || o.Partitions > 1024:
		return fmt.Errorf("partitions must be 1..1024, got %d", o.Partitions)
	case o.Writers < 1 || o.Writers > 16:
		return fmt.Errorf("writers per partition must be 1..16, got %d", o.Writers)
	case o.Tasks < 1 || o.Tasks > 10000:
		return fmt.Errorf("tasks per partition must be 1..10000, got %d", o.Tasks)
	case o.Ingests < 1 || o.Ingests > 16:
		return fmt.Errorf("ingests must be 1..16, got %d", o.Ingests)
	case o.TTL < wire.TTLMinMillis*time.Millisecond || o.TTL > wire.TTLMaxMillis*time.Millisecond || o.TTL%time.Millisecond != 0:
		return fmt.Errorf("the TTL must be whole milliseconds in [%dms, %dms], got %v", wire.TTLMinMillis, wire.TTLMaxMillis, o.TTL)
	case !wire.ValidHolder(wire.Holder(o.Principal, "x")):
		return fmt.Errorf("the principal %q is not 1..%d of [A-Za-z0-9_-]", o.Principal, wire.MaxHolderPartLen)
	case o.Rate <= 0:
		return errors.New("the rate must be positive")
	case o.Writer != WriterRaw && o.Writer != WriterSDK:
		return fmt.Errorf("the writer must be %q or %q, got %q", WriterRaw, WriterSDK, o.Writer)
	case o.ReceiptTimeout <= 0:
		return errors.New("the receipt timeout must be positive")
	case o.Zombie < 0 && o.Zombie != Off:
		return errors.New("the zombie window must not be negative")
	case o.GapWindow < 0 || o.GapTimeout <= 0 || o.DrainTimeout <= 0 || o.RestoreWait <= 0:
		return errors.New("the gap window must not be negative; the gap timeout, drain timeout and restore wait must be positive")
	case o.Replication != "" && o.Replication != ReplicationSync && o.Replication != ReplicationAsync:
		return fmt.Errorf("replication must be %q or %q, got %q", ReplicationSync, ReplicationAsync, o.Replication)
	case o.SplitBrain && o.Replication == "":
		return errors.New("a split brain needs replication (sync or async)")
	case o.Replication != "" && o.External != nil:
		return errors.New("a run against a deployment cannot fail its PostgreSQL over")
	case o.External != nil && o.External.FirstPartition < 0:
		return errors.New("the first partition must not be negative")
	case o.External != nil && o.External.Conn.DatabaseURL == "":
		return errors.New("a run against a deployment needs its database URL")
	}
	return nil
}
