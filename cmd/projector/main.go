// Command projector runs the ledger's projector: LEDGER_LOG → per-task state
// in the KV bucket ledger_tasks, with missing versions re-fetched from
// PostgreSQL. With -rebuild it first replays the PostgreSQL log into fresh
// projections, then continues live.
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
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/migrations"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

func main() { os.Exit(connect.Run("projector", run, os.Args[1:], os.Stderr)) }

func run(args []string) error {
	fs := flag.NewFlagSet("projector", flag.ContinueOnError)
	var svcf connect.Service
	svcf.Register(fs, "9091")
	var cfg projector.Config
	fs.IntVar(&cfg.PartitionCount, "partition-count", connect.EnvInt("LEDGER_PARTITIONS", wire.PartitionsDefault), "partition count N (env LEDGER_PARTITIONS)")
	parts := fs.String("partitions", connect.Env("LEDGER_PROJECT_PARTITIONS", "all"), `partitions this projector owns: "all", or like "0-7" or "1,3,8-9" (env LEDGER_PROJECT_PARTITIONS)`)
	fs.IntVar(&cfg.Replicas, "replicas", connect.EnvInt("LEDGER_REPLICAS", 1), "bucket replicas: 1, or 3 in a cluster (env LEDGER_REPLICAS)")
	fs.IntVar(&cfg.BatchSize, "batch-size", connect.EnvInt("LEDGER_PROJECTOR_BATCH", projector.BatchSizeDefault), "events per turn, a log batch counting as many as it holds (env LEDGER_PROJECTOR_BATCH)")
	fs.IntVar(&cfg.CatchUpBatchSize, "catch-up-batch", connect.EnvInt("LEDGER_PROJECTOR_CATCHUP_BATCH", 0), "events per turn while behind; 0 is 10,000 or -batch-size if larger, -batch-size turns it off (env LEDGER_PROJECTOR_CATCHUP_BATCH)")
	fs.DurationVar(&cfg.Engine.GapTimeout, "gap-timeout", connect.EnvDuration("LEDGER_GAP_TIMEOUT", projection.GapTimeoutDefault), "how long a task waits for a missing version before re-fetching it (env LEDGER_GAP_TIMEOUT)")
	fs.DurationVar(&cfg.StopTimeout, "stop-timeout", connect.EnvDuration("LEDGER_STOP_TIMEOUT", projector.StopTimeoutDefault), "how long a stop lets the turn in hand finish (env LEDGER_STOP_TIMEOUT)")
	fs.DurationVar(&cfg.ReconcileEvery, "reconcile-every", connect.EnvDuration("LEDGER_RECONCILE_EVERY", projector.ReconcileEveryDefault), "how often a page of task heads is compared with the projections; negative turns it off (env LEDGER_RECONCILE_EVERY)")
	fs.DurationVar(&cfg.ReconcileGrace, "reconcile-grace", connect.EnvDuration("LEDGER_RECONCILE_GRACE", projector.ReconcileGraceDefault), "how long a head is left to its log copy before its projection counts as behind (env LEDGER_RECONCILE_GRACE)")
	fs.Int64Var(&cfg.TasksQuota, "tasks-quota", int64(connect.EnvInt("LEDGER_TASKS_QUOTA", projector.TasksQuotaDefault)), "bytes of ledger_tasks values one principal may write, refilled at that much an hour; beyond it a value is written without its data (env LEDGER_TASKS_QUOTA)")
	tasksMax := fs.Int("tasks-max-bytes", connect.EnvInt("LEDGER_TASKS_MAX_BYTES", 0), "max_bytes of the ledger_tasks bucket: 0 keeps the default (512 MiB), -1 lifts the limit (env LEDGER_TASKS_MAX_BYTES)")
	marksMax := fs.Int("marks-max-bytes", connect.EnvInt("LEDGER_MARKS_MAX_BYTES", 0), "max_bytes of the ledger_projector bucket: 0 keeps the default (32 MiB), -1 lifts the limit (env LEDGER_MARKS_MAX_BYTES)")
	rebuild := fs.Bool("rebuild", false, "replay the PostgreSQL log into fresh projections first, then continue live")
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
	log, conn := svcf.Log, &svcf.Conn
	cfg.Prefix = svcf.Prefix
	cfg.TasksMaxBytes, cfg.MarksMaxBytes = int64(*tasksMax), int64(*marksMax)
	var err error
	if cfg.Partitions, err = projector.ParsePartitions(*parts, cfg.PartitionCount); err != nil {
		return err
	}
	conn.Name = "ledger-projector"
	conn.InboxPrefix = cmp.Or(conn.InboxPrefix, connect.InboxPrefixFor("projector"))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// The pool refuses an old primary that came back writable after a
	// failover: it learns the newest timeline from the servers it reaches
	// and from the ingests' record (projector.Deps.Primary).
	conn.Primary = &fence.PrimaryGuard{}
	pool, err := svcf.Postgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := func() error { return migrations.Check(ctx, pool) }
	if err := svcf.WhileStarting(ctx, "PostgreSQL (schema)", schema); err != nil {
		return fmt.Errorf("%w (the ingest applies migrations at start; or run ledgerctl migrate)", err)
	}
	nc, err := svcf.NATS(ctx)
	if err != nil {
		return err
	}
	defer nc.Drain() //nolint:errcheck

	reg := admin.NewRegistry()
	svc, err := projector.New(cfg, projector.Deps{NC: nc, Pool: pool, Logger: log, Registerer: reg, Primary: conn.Primary})
	if err != nil {
		return err
	}
	if *rebuild {
		err := svc.Rebuild(ctx, func(p projector.Progress) {
			log.Info("rebuild progress", slog.Int64("events", p.Done), slog.Int64("total", p.Total),
				slog.Float64("events_per_s", float64(p.Done)/max(p.Elapsed.Seconds(), 1e-9)))
		})
		if err != nil {
			return err
		}
	}
	if err := svc.Start(ctx); err != nil {
		return err
	}
	checks := append(admin.ServiceChecks(pool, nc, svc.CheckConsumer), admin.Check{Name: "pooler", Func: conn.CheckPooler(pool)})
	return admin.ServeUntilDone(ctx, svcf.AdminAddr, reg, checks, svc.Stop, log)
}
