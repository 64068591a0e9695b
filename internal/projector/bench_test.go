package projector_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
)

// BenchmarkProjector measures the projector end to end: 100,000 committed
// events over 2,000 tasks already on LEDGER_LOG (a backlog: every task's
// versions 1, then every task's versions 2, ...), until every task's value
// in the bucket is at its last version. It reports the rate and the CPU
// time this process (the projector and the embedded nats-server) spent per
// event, which a loaded machine blurs less than the rate. "catch-up off"
// turns of BatchSize messages are the baseline of the default catch-up
// turns; run with -count 2 or more, so that they alternate.
func BenchmarkProjector(b *testing.B) {
	for _, c := range []struct {
		name string
		cfg  projector.Config
	}{
		{"catch-up off", projector.Config{CatchUpBatchSize: projector.BatchSizeDefault}},
		{"default", projector.Config{}},
	} {
		b.Run(c.name, func(b *testing.B) { benchmarkProjector(b, c.cfg) })
	}
}

func benchmarkProjector(b *testing.B, cfg projector.Config) {
	const tasks, versions = 2000, 50
	for range b.N {
		b.StopTimer()
		e := newEnv(b)
		e.seedLog(tasks, versions)
		b.StartTimer()
		start, cpu := time.Now(), processCPU(b)
		e.start(cfg)
		for _, task := range []string{"task-1", "task-1000", "task-2000"} {
			e.waitState(task, 5*time.Minute, func(s projection.State) bool { return s.Version == versions })
		}
		elapsed, cpu := time.Since(start), processCPU(b)-cpu
		b.ReportMetric(float64(tasks*versions)/elapsed.Seconds(), "events/s")
		b.ReportMetric(float64(cpu.Microseconds())/float64(tasks*versions), "cpu-µs/event")
		b.ReportMetric(float64(e.bucketWrites())/float64(tasks*versions), "writes/event")
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRebuild measures a rebuild from PostgreSQL: 1,000,000 events over
// 10,000 tasks into a fresh bucket.
func BenchmarkRebuild(b *testing.B) {
	const tasks, versions = 10_000, 100
	for range b.N {
		b.StopTimer()
		e := newEnv(b)
		e.seedDB(tasks, versions)
		p, err := projector.New(projector.Config{}, projector.Deps{NC: e.ns.Conn(b), Pool: e.db.Pool, Logger: ledgertest.Logger()})
		require.NoError(b, err)
		b.StartTimer()
		start := time.Now()
		require.NoError(b, p.Rebuild(context.Background(), nil))
		elapsed := time.Since(start)
		b.ReportMetric(elapsed.Seconds(), "rebuild_s")
		b.ReportMetric(float64(tasks*versions)/elapsed.Seconds(), "events/s")
		st, ok := e.state("task-10000")
		require.True(b, ok)
		require.EqualValues(b, versions, st.Version)
	}
}
