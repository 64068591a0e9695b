package benchreport

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// machine describes the host and the database behind pool.
func machine(ctx context.Context, pool *pgxpool.Pool, throwaway bool) Machine {
	m := Machine{CPUs: runtime.NumCPU(), MemoryBytes: memTotal(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH,
		GoVersion: runtime.Version(), PostgreSQL: "unknown", Throwaway: throwaway}
	var v string
	if err := pool.QueryRow(ctx, `SHOW server_version`).Scan(&v); err == nil {
		if f := strings.Fields(v); len(f) > 0 { // "15.20 (Debian 15.20-1.pgdg120+1)"
			m.PostgreSQL = f[0]
		}
	}
	// A commit's cost is mostly its WAL flush: these say whether there is one.
	_ = pool.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit')`).
		Scan(&m.Fsync, &m.SynchronousCommit)
	return m
}

// memTotal reads MemTotal from /proc/meminfo; 0 where there is none.
func memTotal() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		rest, ok := strings.CutPrefix(s.Text(), "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest) // "24563784 kB"
		if len(f) == 2 && f[1] == "kB" {
			if kb, err := strconv.ParseUint(f[0], 10, 64); err == nil {
				return kb << 10
			}
		}
		return 0
	}
	return 0
}

// gcPercent is this process's GOGC; 0 where the runtime does not say.
func gcPercent() int {
	sample := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int(sample[0].Value.Uint64())
}
