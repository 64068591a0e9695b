package benchreport_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/lab/benchreport"
	"github.com/flowness/ledger/internal/ledgertest"
)

func TestSmallRunReportsEveryRow(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	var progress ledgertest.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	r, err := benchreport.Run(ctx, benchreport.Options{DatabaseURL: db.URL, Events: 1000, Rounds: 2, Rate: 400,
		LatencyDuration: 500 * time.Millisecond, Workers: 2, Progress: &progress})
	require.NoError(t, err)

	require.False(t, r.Machine.Throwaway, "the given database answers")
	require.NotEmpty(t, r.Machine.PostgreSQL)
	require.NotEmpty(t, r.Machine.Fsync)
	require.Equal(t, benchreport.Sections, r.Sections)
	table := r.Table()
	require.Contains(t, table, "machine: ")
	rows := r.Rows()
	require.Len(t, rows, 22, "5 baselines, 3 pipelines, 4 SDK, 5 latency, 5 projector")
	for _, row := range rows {
		require.Contains(t, table, row.Label)
		if row.Label == r.SDKFirstSecond.Label {
			// A run this small lasts a fraction of a second, its first
			// window half of it, which may end before the first receipt.
			continue
		}
		require.Greater(t, row.PerSecond, 0.0, row.Label)
		require.Positive(t, row.Events, row.Label)
		if row.Latency {
			require.Positive(t, row.P50, row.Label)
			require.LessOrEqual(t, row.P50, row.P99, row.Label)
		}
	}
	require.InDelta(t, r.FenceAppend.PerSecond/r.SchemaInsert.PerSecond, r.FenceAppend.Relative, 1e-9,
		"the append against the same writes done set-based")
	for _, row := range []benchreport.Row{r.PerEventInsert, r.SetInsert, r.Copy, r.SchemaInsert, r.FenceAppend, r.FullPipeline,
		r.BarePipeline, r.SDKReceipt, r.SDKSteady, r.SDKKV} {
		require.Greater(t, row.Ratio, 0.0, "%s: ratio to the set-based insert", row.Label)
	}
	require.InDelta(t, 1.0, r.SetInsert.Ratio, 1e-9)
	require.Equal(t, 1000, r.PerEventInsert.Events, "the per-event baseline takes min(Events, 5000)")

	// The pipeline section: alternating rounds, medians, the median of
	// the per-round ratios, CPU per event.
	require.Len(t, r.PipelineRounds, 2)
	require.Equal(t, 2, r.FullPipeline.Rounds)
	require.Equal(t, 2000, r.FullPipeline.Events)
	ratios := []float64{r.PipelineRounds[0].Ratio(), r.PipelineRounds[1].Ratio()}
	require.InDelta(t, (ratios[0]+ratios[1])/2, r.FullPipeline.Relative, 1e-9, "the median of two ratios is their mean")
	require.InDelta(t, (r.PipelineRounds[0].Full+r.PipelineRounds[1].Full)/2, r.FullPipeline.PerSecond, 1e-6)
	require.Positive(t, r.FullPipeline.CPUPerEvent, "this machine has /proc/stat")
	require.Positive(t, r.BarePipeline.CPUPerEvent)
	require.InDelta(t, float64(r.BarePipeline.CPUPerEvent)/float64(r.FullPipeline.CPUPerEvent), r.CPURatio, 1e-9)
	require.Equal(t, r.FullPipeline.PerSecond, r.Saturation)
	require.Equal(t, 2, r.HotPipeline.Rounds, "the hot-task rounds alternate with as many of the many-tasks load")
	require.Positive(t, r.HotPipeline.Relative)
	require.Equal(t, (2+2*2)*1000+200, r.ProjectorBacklog,
		"the projector was stopped through the raw pipelines: every event of their rounds (the hot-task ones too) and their latency path waited for it")

	require.Positive(t, r.SDKReceipt.CPUPerEvent, "the SDK run's machine CPU per event")
	// The SDK section's first second against the rest.
	require.Equal(t, r.SDKReceipt.Events, r.SDKFirstSecond.Events+r.SDKSteady.Events)
	require.InDelta(t, r.SDKFirstSecond.PerSecond/r.SDKSteady.PerSecond, r.SDKFirstSecond.Relative, 1e-9)

	// Latency: the given rate, every path's p99 against the bare pipeline's.
	require.Equal(t, 400, r.Rate)
	require.True(t, r.RateGiven)
	for _, row := range []benchreport.Row{r.LatencyRaw, r.LatencySDKAck, r.LatencySDKReceipt, r.LatencySDKKV, r.LatencyBare} {
		require.True(t, row.Latency, row.Label)
		require.Equal(t, 200, row.Events, "%s: Rate × LatencyDuration events, never more", row.Label)
	}
	for _, row := range []benchreport.Row{r.LatencyRaw, r.LatencySDKAck, r.LatencySDKReceipt, r.LatencySDKKV} {
		require.InDelta(t, float64(row.P99)/float64(r.LatencyBare.P99), row.Relative, 1e-9, row.Label)
	}

	// The projector against raw reads of the same messages and rows.
	require.Equal(t, 1000, r.CatchUp.Events, "the backlog is one phase of events")
	require.Equal(t, r.CatchUp.Events, r.LogRead.Events)
	require.Equal(t, r.Rebuild.Events, r.EventsRead.Events)
	require.Equal(t, r.CatchUp.Events, r.Backlog.Events, "the catch-up folds what the backlog committed")
	require.InDelta(t, r.CatchUp.PerSecond/r.Backlog.PerSecond, r.CatchUp.Relative, 1e-9, "the catch-up over the commit rate")
	require.InDelta(t, r.CatchUp.PerSecond/r.LogRead.PerSecond, r.CatchUpVsRead, 1e-9)
	require.Contains(t, r.Table(), "the raw read of the same LEDGER_LOG messages")
	require.InDelta(t, r.Rebuild.PerSecond/r.EventsRead.PerSecond, r.Rebuild.Relative, 1e-9)

	out := progress.String()
	require.Contains(t, out, "bench: pipeline round 2/2: full ")
	require.Regexp(t, `\rbench: \S.* [0-9,]+/[0-9,]+ events \(\d+%\) [0-9,]+ ev/s`, out)
	require.True(t, strings.HasSuffix(out, "\r"), "the progress line is cleared at the end")
}

func TestLatencyDefaultsToHalfTheFullPipelineRate(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	r, err := benchreport.Run(ctx, benchreport.Options{DatabaseURL: db.URL, Only: []benchreport.Section{benchreport.SectionLatency},
		Events: 1000, LatencyDuration: 200 * time.Millisecond, Workers: 2, Progress: &ledgertest.Buffer{}})
	require.NoError(t, err)

	require.False(t, r.RateGiven)
	require.Positive(t, r.Saturation, "without the pipeline section, one full-pipeline round measures it")
	require.Equal(t, int(r.Saturation/2), r.Rate)
	require.Contains(t, r.Table(), "half the full pipeline's")

	var labels []string
	for _, row := range r.Rows() {
		labels = append(labels, row.Label)
		require.True(t, row.Latency, "only the latency section ran: %s", row.Label)
	}
	require.Len(t, labels, 5)
	require.Empty(t, r.FullPipeline.Label, "the saturation round is not the pipeline section's row")

	// -json prints only what ran.
	b, err := json.Marshal(r)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	require.Contains(t, got, "latency_bare")
	require.Contains(t, got, "saturation_per_second")
	require.NotContains(t, got, "set_insert")
	require.NotContains(t, got, "full_pipeline")
}
