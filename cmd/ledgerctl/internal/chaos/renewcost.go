package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// renewalProbeTime is how long renewalCost renews: long enough for the
// server's CPU time, counted in clock ticks, to be read to a few percent.
const renewalProbeTime = time.Second

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat: 100
// on every Linux architecture Go supports.
const clockTicks = 100

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
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("read the CPU time of process %d: %w", pid, err)
	}
	return parseProcStat(b)
}

// errProcStat is wrapped by parseProcStat's errors.
var errProcStat = errors.New("not a /proc/<pid>/stat line")

// parseProcStat reads utime and stime, fields 14 and 15 of a
// /proc/<pid>/stat line (proc(5)). Field 2, the command in parentheses, may
// itself hold spaces and parentheses, so the fields are counted from the
// last ')'.
func parseProcStat(b []byte) (time.Duration, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, fmt.Errorf("%w: no command", errProcStat)
	}
	fields := bytes.Fields(b[end+1:])
	// fields[0] is field 3 (state), so field n is fields[n-3].
	if len(fields) < 15-3+1 {
		return 0, fmt.Errorf("%w: %d fields after the command", errProcStat, len(fields))
	}
	var ticks uint64
	for _, f := range fields[14-3 : 15-3+1] {
		n, err := strconv.ParseUint(string(f), 10, 63)
		if err != nil {
			return 0, fmt.Errorf("%w: CPU time %q: %w", errProcStat, f, err)
		}
		ticks += n
	}
	// Two fields below 2^63 each sum below 2^64; no tick count a process
	// reaches comes near overflowing Duration, but a hostile line could.
	if ticks > uint64(1<<63-1)/uint64(time.Second/clockTicks) {
		return 0, fmt.Errorf("%w: CPU time of %d ticks overflows", errProcStat, ticks)
	}
	return time.Duration(ticks) * (time.Second / clockTicks), nil
}
