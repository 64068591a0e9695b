package ingest_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
)

// stageSeconds reads ledger_ingest_stage_seconds: per stage, the count of
// observations and their sum.
func stageSeconds(t *testing.T, reg *prometheus.Registry) (count map[string]uint64, sum map[string]float64) {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	count, sum = map[string]uint64{}, map[string]float64{}
	for _, f := range families {
		if f.GetName() != "ledger_ingest_stage_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					count[l.GetValue()] = m.GetHistogram().GetSampleCount()
					sum[l.GetValue()] = m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return count, sum
}

// ledger_ingest_stage_seconds says where an event's time to its receipt
// goes: each event, alone or in a batch message, is counted once in every
// stage, and its stages add up within its time to the receipt. Switch:
// leave out the call that counts delivery and queue (metrics.queued), and
// their counts stay 0.
func TestStageSecondsSayWhereAReceiptsTimeGoes(t *testing.T) {
	t.Parallel()
	e, reg := newMeteredEnv(t, ingest.Config{})
	const holder = "worker-a.1"
	l := e.acquire(3, holder, 60000)
	ev := func(task string, v int64) event {
		return event{id: newID(), partition: 3, task: task, holder: holder, generation: l.Generation,
			version: v, typ: "step", payload: fmt.Sprintf(`{"v":%d}`, v)}
	}
	const alone, batched = 20, 20
	for v := range int64(alone) {
		e.publish(ev("alone", v+1))
	}
	var batch []event
	for v := range int64(batched) {
		batch = append(batch, ev("batched", v+1))
	}
	e.publishBatch(batch...)

	var count map[string]uint64
	var sum map[string]float64
	// A gather reads the stages one after another while lanes count: wait
	// until each has counted every event, then hold each to exactly that.
	require.Eventually(t, func() bool {
		count, sum = stageSeconds(t, reg)
		for _, st := range []string{"delivery", "queue", "append", "handoff", "copies", "receipt"} {
			if count[st] < alone+batched {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "every event's stages are counted")
	require.EqualValues(t, alone+batched, count["receipt"])
	require.EqualValues(t, alone+batched, count["delivery"], "each event's delivery once")
	require.EqualValues(t, alone+batched, count["queue"], "each event's queue once")
	for _, st := range []string{"append", "handoff", "copies"} {
		require.EqualValues(t, alone+batched, count[st], "a batch's %s, once for each of its events", st)
	}
	require.GreaterOrEqual(t, sum["receipt"], sum["delivery"]+sum["queue"]+sum["append"]+sum["handoff"]+sum["copies"],
		"each event's stages follow one another within its time to the receipt")
	require.Positive(t, sum["receipt"])
	require.Equal(t, 2, e.count(`SELECT count(DISTINCT task_id) FROM ledger.events WHERE task_id IN ('alone', 'batched')`))
}
