package chaos

import (
	"context"
	"time"
)

// Fault is one kind of fault a run injects. Its entry in Faults is the one
// place that names it, gives its flag and default, says when it applies and
// what injects it.
type Fault struct {
	// Name is how the summary counts it: faults={name:N}.
	Name string
	// Flag is the ledgerlab chaos flag of its mean interval, without the
	// dash. Empty: it shares the interval of the entry that owns the flag.
	Flag string
	// Default is its mean interval; Off means off unless asked for.
	Default time.Duration
	// Usage is the flag's help line.
	Usage string
	// Needs says when it applies, as the docs say it; applies is the rule.
	Needs string
	// zeroKeepsDefault makes a 0 on the command line the default, not Off.
	zeroKeepsDefault bool
	// every is its interval in Options.
	every func(*Options) *time.Duration
	// applies says whether this run injects it at all.
	applies func(*run) bool
	// inject injects it once.
	inject func(*run, context.Context)
}

// Faults are the kinds of fault, in the order the summary lists them. A new
// fault is an entry here, its interval in Options, its function and its row
// in docs/internals/chaos.md (TestEveryFaultIsInTheDocs checks the row).
var Faults = []Fault{
	{Name: FaultSigstop, Flag: "sigstop-every", Default: SigstopEveryDefault,
		Usage:   "mean time between SIGSTOPs of a writer (1.25-2 TTLs each); 0: none",
		Needs:   "every run, -external too",
		every:   func(o *Options) *time.Duration { return &o.SigstopEvery },
		applies: func(*run) bool { return true },
		inject:  (*run).sigstop},
	{Name: FaultKillIngest, Flag: "kill-ingest-every", Default: KillIngestEveryDefault,
		Usage:   "mean time between kill -9 of an ingest; 0: none",
		Needs:   "a run of its own",
		every:   func(o *Options) *time.Duration { return &o.KillIngestEvery },
		applies: ownRun,
		inject:  (*run).killIngest},
	{Name: FaultNATSRestart, Flag: "nats-restart-every", Default: NATSRestartEveryDefault,
		Usage:   "mean time between NATS restarts (kill -9; with -cluster of one node); 0: none",
		Needs:   "a run of its own, one NATS node",
		every:   func(o *Options) *time.Duration { return &o.NATSRestartEvery },
		applies: func(r *run) bool { return ownRun(r) && !r.o.Cluster },
		inject:  (*run).restartNATS},
	{Name: FaultNATSKill, Default: NATSRestartEveryDefault,
		Needs:   "a run of its own, -cluster",
		every:   func(o *Options) *time.Duration { return &o.NATSRestartEvery },
		applies: func(r *run) bool { return ownRun(r) && r.o.Cluster },
		inject:  (*run).killNATSNode},
	{Name: FaultPGRestart, Flag: "pg-restart-every", Default: PGRestartEveryDefault,
		Usage:   "mean time between immediate-mode PostgreSQL restarts; 0: none",
		Needs:   "a run of its own, no -replication",
		every:   func(o *Options) *time.Duration { return &o.PGRestartEvery },
		applies: func(r *run) bool { return ownRun(r) && r.o.Replication == "" },
		inject:  (*run).restartPG},
	{Name: FaultPGCut, Flag: "pg-cut-every", Default: PGCutEveryDefault,
		Usage:   "mean time between 1-3 s cuts of the network between an ingest and PostgreSQL; 0: none",
		Needs:   "a run of its own, no -replication (its proxies to PostgreSQL)",
		every:   func(o *Options) *time.Duration { return &o.PGCutEvery },
		applies: func(r *run) bool { return ownRun(r) && len(r.pgProxies) > 0 },
		inject:  (*run).cutPG},
	{Name: FaultPGFailover, Flag: "pg-failover-every", Default: PGFailoverEveryDefault,
		Usage: "with -replication: mean time between kill -9 of the primary and promotions of the standby " +
			"(async: frozen behind first)",
		Needs:            "a run of its own, -replication",
		zeroKeepsDefault: true,
		every:            func(o *Options) *time.Duration { return &o.PGFailoverEvery },
		applies:          func(r *run) bool { return ownRun(r) && r.o.Replication != "" },
		inject:           (*run).failoverPG},
	{Name: FaultNATSLoss, Flag: "storage-loss-every", Default: Off,
		Usage: "mean time between kill -9 of NATS (with -cluster of one node) with the tail of its stream files " +
			"cut (with -cluster, every other time a block corrupted); 0: none",
		Needs:   "a run of its own, asked for",
		every:   func(o *Options) *time.Duration { return &o.StorageLossEvery },
		applies: func(r *run) bool { return ownRun(r) && r.o.StorageLossEvery > 0 },
		inject:  (*run).loseNATSStorage},
}

// ownRun is a run that started the ledger's processes, which it may kill.
func ownRun(r *run) bool { return r.o.External == nil }

// Every is the fault's interval in o, for a flag to set.
func (f Fault) Every(o *Options) *time.Duration { return f.every(o) }

// FlagDefault is the default the flag shows: 0 for a fault off by default.
func (f Fault) FlagDefault() time.Duration { return max(f.Default, 0) }

// ZeroIsOff sets to Off every fault interval in o that a flag set to 0,
// except where 0 keeps the default.
func ZeroIsOff(o *Options) {
	for _, f := range Faults {
		if p := f.every(o); f.Flag != "" && !f.zeroKeepsDefault && *p == 0 {
			*p = Off
		}
	}
}
