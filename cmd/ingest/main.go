// Command ingest runs the ledger's ingest service: LEDGER_IN → fenced append
// in PostgreSQL → LEDGER_LOG / LEDGER_DLQ / receipts → ack, and the lease
// micro service. Configuration comes from flags, or the environment
// variables named in -help.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/flowness/ledger/internal/admin"
	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/migrations"
	"github.com/flowness/ledger/pkg/fence"
)

func main() { os.Exit(connect.Run("ingest", run, os.Args[1:], os.Stderr)) }

func run(args []string) error {
	fs := flag.NewFlagSet("ingest", flag.ContinueOnError)
	var svcf connect.Service
	svcf.Register(fs, "9090")
	var cfg ingest.Config
	var fcfg fence.Config
	fs.IntVar(&fcfg.Partitions, "partitions", connect.EnvInt("LEDGER_PARTITIONS", fence.PartitionsDefault), "partition count N (env LEDGER_PARTITIONS)")
	fs.DurationVar(&fcfg.TTL, "lease-ttl", connect.EnvDuration("LEDGER_LEASE_TTL", fence.TTLDefault), "default lease TTL (env LEDGER_LEASE_TTL)")
	fs.IntVar(&fcfg.MaxPayload, "max-payload", connect.EnvInt("LEDGER_MAX_PAYLOAD", fence.MaxPayloadDefault), "largest event payload in bytes (env LEDGER_MAX_PAYLOAD)")
	sharedTasks := fs.String("shared-tasks", connect.Env("LEDGER_SHARED_TASKS", "false"), "let any principal write any task; by default a task is the principal's that wrote its version 1, and another's event on it is invalid/not_owner (env LEDGER_SHARED_TASKS)")
	fs.IntVar(&cfg.BatchSize, "batch-size", connect.EnvInt("LEDGER_BATCH_SIZE", ingest.BatchSizeDefault), "most events per fenced append (env LEDGER_BATCH_SIZE)")
	fs.IntVar(&cfg.MaxBatchBytes, "max-batch-bytes", connect.EnvInt("LEDGER_MAX_BATCH_BYTES", ingest.MaxBatchBytesDefault), "payload bytes that end a batch; bounds how long a batch holds its leases (env LEDGER_MAX_BATCH_BYTES)")
	fs.DurationVar(&cfg.BatchWait, "batch-wait", connect.EnvDuration("LEDGER_BATCH_WAIT", ingest.BatchWaitDefault), "how long a batch waits to fill (env LEDGER_BATCH_WAIT)")
	fs.DurationVar(&cfg.GapWindow, "gap-window", connect.EnvDuration("LEDGER_GAP_WINDOW", ingest.GapWindowDefault), "how long an early version waits for the missing ones (env LEDGER_GAP_WINDOW)")
	fs.DurationVar(&cfg.LogTailWindow, "log-tail-window", connect.EnvDuration("LEDGER_LOG_TAIL_WINDOW", ingest.LogTailWindowDefault), "how far back, at start and after a NATS reconnect, LEDGER_LOG is checked for lost copies; negative turns it off (env LEDGER_LOG_TAIL_WINDOW)")
	fs.BoolVar(&cfg.LogBatches, "log-batches", connect.EnvBool("LEDGER_LOG_BATCHES", false), "store commits in LEDGER_LOG as one message per partition of a batch (docs/contract.md §4); upgrade every reader of LEDGER_LOG first (env LEDGER_LOG_BATCHES)")
	fs.IntVar(&cfg.Lanes, "lanes", connect.EnvInt("LEDGER_LANES", ingest.LanesDefault()), "batches processed at once; default one per CPU, 2 to 8 (env LEDGER_LANES)")
	fs.DurationVar(&cfg.ClaimTTL, "claim-ttl", connect.EnvDuration("LEDGER_CLAIM_TTL", ingest.ClaimTTLDefault), "how long this ingest's claims on its partitions last without a heartbeat; another ingest takes over about this long after it dies (env LEDGER_CLAIM_TTL)")
	fs.IntVar(&cfg.MaxWaitingPerPrincipal, "max-waiting", connect.EnvInt("LEDGER_MAX_WAITING", ingest.MaxWaitingPerPrincipalDefault), "events of one principal that may wait in memory for an earlier version; beyond it they go back to LEDGER_IN for later (env LEDGER_MAX_WAITING)")
	fs.IntVar(&cfg.MaxLeasesPerPrincipal, "max-leases-per-principal", connect.EnvInt("LEDGER_MAX_LEASES_PER_PRINCIPAL", 0), "unexpired leases one principal may hold at once; 0 sets no cap (env LEDGER_MAX_LEASES_PER_PRINCIPAL)")
	fs.DurationVar(&cfg.MaxLeaseTTL, "max-lease-ttl", connect.EnvDuration("LEDGER_MAX_LEASE_TTL", 0), "largest TTL an acquire or renewal may ask for, 100ms..5m; 0 leaves 5m (env LEDGER_MAX_LEASE_TTL)")
	fs.Float64Var(&cfg.LeaseRate, "lease-rate", float64(connect.EnvInt("LEDGER_LEASE_RATE", ingest.LeaseRateDefault)), "lease service requests a second one principal may send; beyond it (and -lease-burst) they are refused rate_limited at once (env LEDGER_LEASE_RATE)")
	fs.IntVar(&cfg.LeaseBurst, "lease-burst", connect.EnvInt("LEDGER_LEASE_BURST", ingest.LeaseBurstDefault), "burst of lease service requests above -lease-rate (env LEDGER_LEASE_BURST)")
	fs.IntVar(&cfg.LeaseInFlight, "lease-in-flight", connect.EnvInt("LEDGER_LEASE_IN_FLIGHT", ingest.LeaseInFlightDefault), "lease service requests of one principal waiting or served at once; beyond it they are refused busy at once (env LEDGER_LEASE_IN_FLIGHT)")
	fs.IntVar(&cfg.LeaseWorkers, "lease-workers", connect.EnvInt("LEDGER_LEASE_WORKERS", ingest.LeaseWorkersDefault), "lease service requests served at once, round-robin over the principals, renewals first (env LEDGER_LEASE_WORKERS)")
	fs.DurationVar(&cfg.LeaseMaxAge, "lease-max-age", connect.EnvDuration("LEDGER_LEASE_MAX_AGE", ingest.LeaseMaxAgeDefault), "a lease request that waited longer is dropped unanswered (env LEDGER_LEASE_MAX_AGE)")
	fs.Int64Var(&cfg.DeadLetterQuota, "dead-letter-quota", int64(connect.EnvInt("LEDGER_DEAD_LETTER_QUOTA", ingest.DeadLetterQuotaDefault)), "dead letter bytes one principal may store, refilled at that much an hour; beyond it a letter keeps its verdict without the message's body and headers (env LEDGER_DEAD_LETTER_QUOTA)")
	fs.IntVar(&cfg.Replicas, "replicas", connect.EnvInt("LEDGER_REPLICAS", 1), "stream replicas: 1, or 3 in a cluster (env LEDGER_REPLICAS)")
	durability := fs.String("require-durability", connect.Env("LEDGER_REQUIRE_DURABILITY", "none"), "refuse to start, and be unready, while PostgreSQL offers less: none, local (fsync and synchronous_commit on) or sync (synchronous replication too); below sync the ingest warns at start (env LEDGER_REQUIRE_DURABILITY)")
	migrate := fs.Bool("migrate", true, "apply database migrations at start")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process to this file, from start until it exits on SIGTERM or SIGINT (for measurement: ledgerlab bench -external); default none")
	if ok, err := svcf.Parse(fs, args); !ok {
		return err
	}
	if *cpuProfile != "" {
		stop, err := admin.StartCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		// Deferred first, so it runs last: the profile covers the graceful
		// stop too.
		defer stop()
	}
	cfg.RequireDurability = fence.DurabilityLevel(*durability)
	switch *sharedTasks {
	case "true":
		fcfg.SharedTasks = true
	case "false":
	default:
		return fmt.Errorf("ingest: -shared-tasks %q: want true or false", *sharedTasks)
	}
	log, conn := svcf.Log, &svcf.Conn
	cfg.Prefix = svcf.Prefix
	conn.Name = "ledger-ingest"
	conn.InboxPrefix = cmp.Or(conn.InboxPrefix, connect.InboxPrefixFor("ingest"))
	// Every lane holds a connection for its batch; lease renewals must never
	// wait behind them (a renewal that waits past the TTL loses a lease).
	conn.MinPoolSize = cfg.WithDefaults().Lanes + 4

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// The newest primary the ledger wrote to: connections and appends
	// refuse an older one (fence.PrimaryGuard, kept in ledger_witness).
	fcfg.Primary = &fence.PrimaryGuard{}
	conn.Primary = fcfg.Primary
	pool, err := svcf.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *migrate {
		var applied []int64
		err := svcf.WhileStarting(ctx, "PostgreSQL (migrations)", func() (err error) {
			applied, err = migrations.Up(ctx, pool, log)
			return err
		})
		if err != nil {
			return err
		}
		log.Info("schema current", slog.Any("applied", applied))
	}
	store, err := fence.New(pool, fcfg)
	if err != nil {
		return err
	}
	nc, err := svcf.NATS(ctx)
	if err != nil {
		return err
	}
	defer nc.Drain() //nolint:errcheck

	reg := admin.NewRegistry()
	svc, err := ingest.New(cfg, ingest.Deps{NC: nc, Store: store, Logger: log, Registerer: reg,
		WhileStarting: svcf.WhileStarting})
	if err != nil {
		return err
	}
	if err := svc.Start(ctx); err != nil {
		return err
	}
	return admin.ServeUntilDone(ctx, svcf.AdminAddr, reg, append(admin.ServiceChecks(pool, nc, svc.CheckConsumer),
		admin.Check{Name: "durability", Func: svc.CheckDurability}, admin.Check{Name: "primary", Func: svc.CheckPrimary},
		admin.Check{Name: "memory", Func: svc.CheckMemory}, admin.Check{Name: "pooler", Func: conn.CheckPooler(pool)}), svc.Stop, log)
}
