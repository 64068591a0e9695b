package benchreport_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/benchreport"
	"github.com/flowness/ledger/internal/dbtest"
)

// lockedBuffer is a progress writer that the test can read safely.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestSmallRunReportsEveryRow(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	var progress lockedBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	r, err := benchreport.Run(ctx, benchreport.Options{DatabaseURL: db.URL, Events: 2000, Rate: 500,
		LatencyDuration: time.Second, Workers: 2, Progress: &progress})
	require.NoError(t, err)

	require.False(t, r.Machine.Throwaway, "the given database answers")
	require.NotEmpty(t, r.Machine.PostgreSQL)
	require.NotEmpty(t, r.Machine.Fsync)
	require.Contains(t, r.Table(), "machine: ")
	rows := r.Rows()
	require.Len(t, rows, 9)
	table := r.Table()
	for _, row := range rows {
		require.Greater(t, row.PerSecond, 0.0, row.Label)
		require.Positive(t, row.Events, row.Label)
		if row.Latency {
			require.Positive(t, row.P50, row.Label)
			require.LessOrEqual(t, row.P50, row.P99, row.Label)
		} else {
			require.Greater(t, row.Ratio, 0.0, row.Label)
		}
		require.Contains(t, table, row.Label)
	}
	require.Equal(t, 2000, r.PerEventInsert.Events, "the per-event baseline takes min(Events, 5000)")
	require.Equal(t, 500, r.LatencyReceipt.Events, "Rate × LatencyDuration events, never more")
	require.InDelta(t, 1.0, r.SetInsert.Ratio, 1e-9)

	out := progress.String()
	require.Contains(t, out, "bench: pipeline ")
	require.Regexp(t, `\rbench: \S.* [0-9,]+/[0-9,]+ events \(\d+%\) [0-9,]+ ev/s`, out)
	require.True(t, strings.HasSuffix(out, "\r"), "the progress line is cleared at the end")
}
