package projector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/projection"
)

// One principal cannot fill ledger_tasks for everyone: beyond its share
// its tasks' values are written without their data (data null,
// data_too_large its size; version, status and seq exact), so its bytes in
// the bucket stay bounded, and another principal's task afterwards is
// projected whole. Each value cut is counted under its principal.
func TestOnePrincipalsProjectionsStayWithinItsShare(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const share = 16 << 10
	reg := prometheus.NewRegistry()
	e.startWith(projector.Config{TasksQuota: share}, reg)
	publishAs := func(holder string, c committed) {
		lc := c.logCopy()
		lc.Holder = holder
		m := e.subj.LogMsg(lc)
		_, err := e.js.PublishMsg(context.Background(), m)
		require.NoError(t, err)
	}
	const flood = 20
	for i := range flood {
		task := fmt.Sprintf("junk-%d", i)
		publishAs("billing.x", e.commit(1, task, []string{"fill"}, []string{bigPayload("x", 4000)})[0])
	}
	quiet := e.commit(2, "report-1", []string{"done"}, []string{bigPayload("r", 4000)})[0]
	publishAs("reports.a", quiet)

	st := e.waitState("report-1", 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
	require.Equal(t, 0, st.DataTooLarge, "another principal's projection is whole")
	require.Contains(t, string(st.Data), "rrrr")

	var stored, cut int
	for i := range flood {
		task := fmt.Sprintf("junk-%d", i)
		s := e.waitState(task, 10*time.Second, func(s projection.State) bool { return s.Version == 1 })
		entry, err := e.bucket().Get(context.Background(), task)
		require.NoError(t, err)
		stored += len(entry.Value())
		if s.DataTooLarge != 0 {
			cut++
			require.Equal(t, "null", string(s.Data))
			require.Equal(t, "fill", s.Status, "status and version stay exact")
		}
	}
	t.Logf("billing: %d tasks, %d without data, %d bytes in the bucket (share %d)", flood, cut, stored, share)
	require.Positive(t, cut)
	require.Less(t, stored, share+flood*512, "the share, and a small value beyond it")
	waitMetric(t, reg, "ledger_refusals_total", float64(cut), "path", "projection", "principal", "billing")
	require.Zero(t, metric(t, reg, "ledger_refusals_total", "principal", "reports"))
}
