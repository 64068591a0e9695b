package projector_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
)

// BenchmarkProjector measures the projector end to end: 100,000 committed
// events over 2,000 tasks already on LEDGER_LOG, until every task's value in
// the bucket is at its last version.
func BenchmarkProjector(b *testing.B) {
	const tasks, versions = 2000, 50
	for range b.N {
		b.StopTimer()
		e := newEnv(b)
		e.seedLog(tasks, versions)
		b.StartTimer()
		start := time.Now()
		e.start(projector.Config{})
		for _, task := range []string{"task-1", "task-1000", "task-2000"} {
			e.waitState(task, 5*time.Minute, func(s projection.State) bool { return s.Version == versions })
		}
		elapsed := time.Since(start)
		b.ReportMetric(float64(tasks*versions)/elapsed.Seconds(), "events/s")
	}
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
