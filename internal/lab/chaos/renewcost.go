package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowness/ledger/internal/lab/procstat"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// renewalProbeTime is how long renewalCost renews: long enough for the
// server's CPU time, counted in clock ticks, to be read to a few percent.
const renewalProbeTime = time.Second

// renewalCost renews a lease of the probe's own partition back to back on
// one connection, with the ledger's own renewal (pkg/fence, the statement
// the ingest runs for a worker's renewal), and reads the CPU time of the
// server process serving that connection before and after.
func (f *failover) renewalCost(ctx context.Context) (RenewalCost, error) {
	cfg, err := pgxpool.ParseConfig(f.dbURL)
	if err != nil {
		return RenewalCost{}, fmt.Errorf("renewal cost: database URL: %w", err)
	}
	// One connection: every renewal is served by the same server process.
	cfg.MaxConns, cfg.MinConns = 1, 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return RenewalCost{}, fmt.Errorf("renewal cost: database: %w", err)
	}
	defer pool.Close()
	store, err := fence.New(pool, fence.Config{Partitions: f.o.Partitions, TTL: f.ttl})
	if err != nil {
		return RenewalCost{}, fmt.Errorf("renewal cost: %w", err)
	}
	probe, holder := failoverPartition+1, wire.Holder(f.o.Principal, f.id+"-probe")
	l, err := store.Acquire(ctx, probe, holder, f.ttl)
	if err != nil {
		return RenewalCost{}, fmt.Errorf("renewal cost: acquire partition %d: %w", probe, err)
	}
	var pid int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return RenewalCost{}, fmt.Errorf("renewal cost: server process: %w", err)
	}
	cpu0, cpuErr := processCPU(pid)
	var c RenewalCost
	began := time.Now()
	for time.Since(began) < renewalProbeTime {
		if _, err := store.Renew(ctx, probe, holder, l.Generation, f.ttl); err != nil {
			return RenewalCost{}, fmt.Errorf("renewal cost: renew partition %d: %w", probe, err)
		}
		c.N++
	}
	took := time.Since(began)
	cpu1, err := processCPU(pid)
	c.RoundTripMicros = float64(took.Microseconds()) / float64(c.N)
	c.CPUMicros = -1
	if cpuErr == nil && err == nil {
		c.CPUMicros = float64((cpu1 - cpu0).Microseconds()) / float64(c.N)
	}
	if err := store.Release(ctx, probe, holder, l.Generation); err != nil {
		return RenewalCost{}, fmt.Errorf("renewal cost: release partition %d: %w", probe, err)
	}
	f.logf("renewal cost: %d renewals, %.0fµs each, server CPU %.1fµs each", c.N, c.RoundTripMicros, c.CPUMicros)
	return c, nil
}

// processCPU is the user and system CPU time process pid has used.
func processCPU(pid int) (time.Duration, error) {
	p, err := procstat.ReadProcess(pid)
	return p.Own, err
}
