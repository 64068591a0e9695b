package benchreport

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Labels of the rows whose label does not depend on the run, as the table
// prints them.
const (
	LabelPerEventInsert = "per-event fenced INSERT (1 conn)"
	LabelSetInsert      = "set-based fenced insert (1000/tx)"
	LabelCopy           = "COPY (1000/batch)"
	LabelSchemaInsert   = "set-based fenced insert, the ledger's tables (1000/tx)"
	LabelFenceAppend    = "fence.Append (1000/batch, all checks)"
	LabelFullPipeline   = "pipeline: raw → ingest (LOG copy, receipt), median"
	LabelBarePipeline   = "pipeline: raw → bare (one set-based insert), median"
	LabelHotPipeline    = "pipeline: raw → ingest, one hot task a partition, median"
	LabelSDKKV          = "pipeline: SDK → ingest → projector KV"
	LabelBacklog        = "projector: its backlog, committed while it is down"
	LabelCatchUp        = "projector: LEDGER_LOG → KV (catch-up)"
	LabelLogRead        = "raw read of the same LEDGER_LOG messages"
	LabelRebuild        = "projector: rebuild from PostgreSQL"
	LabelEventsRead     = "raw read of the same ledger.events rows"
)

// Report is the outcome of a run: one Row per line of the table. The rows
// of a section that did not run are zero.
type Report struct {
	// Machine describes where the run ran.
	Machine Machine `json:"machine"`
	// Sections are the sections that ran, in run order.
	Sections []Section `json:"sections"`
	// Events, Rounds, Workers and LatencyDuration are the load the run
	// used (Options with defaults applied); Tasks is how many tasks each
	// phase spread its events over.
	Events          int           `json:"events"`
	Rounds          int           `json:"rounds"`
	Tasks           int           `json:"tasks"`
	Workers         int           `json:"workers"`
	LatencyDuration time.Duration `json:"latency_duration_ns"`
	// GCPercent is the garbage collector's target (GOGC) of this process,
	// which hosts every part of the ledger: the command gives it the
	// services' default (connect.GCPercentDefault) unless GOGC is set.
	GCPercent int `json:"gc_percent"`
	// LogBatches is set when the ingest wrote LEDGER_LOG in log batches.
	LogBatches bool `json:"log_batches,omitempty"`
	// Rate is the load offered on each latency path, in events/s: the
	// given Options.Rate (RateGiven), or half of Saturation.
	Rate      int  `json:"rate,omitempty"`
	RateGiven bool `json:"rate_given,omitempty"`
	// Saturation is the full pipeline's rate, events/s: its median over
	// the pipeline section's rounds, or one round's when that section did
	// not run and the latency section needed it.
	Saturation float64 `json:"saturation_per_second,omitempty"`

	// The raw baselines, each on one connection: a fenced INSERT per event
	// (autocommit), a set-based fenced insert and COPY, both 1,000 events a
	// batch, into the scratch schema ledger_bench; and fence.Append, the
	// ledger's own append with every check, into ledger.events.
	PerEventInsert Row `json:"per_event_insert,omitzero"`
	SetInsert      Row `json:"set_insert,omitzero"`
	Copy           Row `json:"copy,omitzero"`
	// SchemaInsert is the set-based fenced insert again, 1,000 events a
	// statement, into the ledger's own tables: the events' row, its id in
	// ledger.event_ids and its task's head in ledger.heads, all in one
	// statement with nothing read first. It is what fence.Append must
	// write; FenceAppend.Relative is the append over it, the cost of
	// every check (recorded verdicts, heads, duplicates, the horizon).
	SchemaInsert Row `json:"schema_insert,omitzero"`
	FenceAppend  Row `json:"fence_append,omitzero"`
	// Raw JetStream publishers (no SDK, projector stopped) into the full
	// ingest (fence.Append, LEDGER_LOG copy, receipt, ack) and into the
	// bare pipeline (fetch, one set-based fenced insert, ack), in
	// alternating rounds of Events events: medians of the rounds' rates,
	// FullPipeline.Relative the median of the per-round ratios full/bare,
	// and the machine's CPU time per event (medians).
	FullPipeline Row `json:"full_pipeline,omitzero"`
	BarePipeline Row `json:"bare_pipeline,omitzero"`
	// HotPipeline is the full pipeline again with every event on one task
	// of each partition (hundreds of versions a second per task, each
	// task's versions pipelined in order), in rounds alternating with the
	// many-tasks load; Relative is the median per-round ratio to it.
	HotPipeline    Row     `json:"hot_pipeline,omitzero"`
	PipelineRounds []Round `json:"pipeline_rounds,omitempty"`
	// ProjectorBacklog is how many LEDGER_LOG messages the projector
	// found waiting when it started again after the raw pipelines: every
	// event they committed, since it was stopped meanwhile.
	ProjectorBacklog int `json:"projector_backlog,omitempty"`
	// CPURatio is the bare pipeline's CPU time per event over the full
	// one's (medians): what full/bare would be on a machine doing nothing
	// else, since both are CPU-bound on a small one.
	CPURatio float64 `json:"cpu_ratio,omitempty"`
	// Workers SDK clients publish Events events over new tasks (so each
	// task's first event waits for the SDK to learn its head, as with any
	// fresh worker): rates from the first publish to the last commit
	// receipt, the same in the first FirstWindow and after it
	// (SDKFirstSecond.Relative is their ratio), and to the moment the
	// bucket ledger_tasks holds every task at its last version.
	SDKReceipt     Row `json:"sdk_receipt,omitzero"`
	SDKFirstSecond Row `json:"sdk_first_second,omitzero"`
	SDKSteady      Row `json:"sdk_steady,omitzero"`
	SDKKV          Row `json:"sdk_kv,omitzero"`
	// Latency at Rate for LatencyDuration a path: raw publish → receipt
	// and bare publish → commit (alternating halves, projector stopped),
	// then the SDK's publish → JetStream ack, → receipt and → first bucket
	// value of its task at its version or later. Each Relative is its p99
	// over the bare pipeline's; Events/PerSecond are the events published
	// and the rate achieved.
	LatencyRaw        Row `json:"latency_raw,omitzero"`
	LatencySDKAck     Row `json:"latency_sdk_ack,omitzero"`
	LatencySDKReceipt Row `json:"latency_sdk_receipt,omitzero"`
	LatencySDKKV      Row `json:"latency_sdk_kv,omitzero"`
	LatencyBare       Row `json:"latency_bare,omitzero"`
	// The projector catching up on Events log copies published while it
	// was stopped (Backlog: the rate the ingest committed them at, the
	// peak commit rate of the run), beside an ordered consumer reading the
	// same messages; and a rebuild of every projection from ledger.events,
	// beside a scan of the same rows in the same chunks. CatchUp.Relative
	// is the catch-up over the backlog's commit rate (the target is 2 or
	// more) and CatchUpVsRead its rate over the raw read; Rebuild.Relative
	// is the rebuild over its raw read.
	Backlog       Row     `json:"backlog,omitzero"`
	CatchUp       Row     `json:"catch_up,omitzero"`
	CatchUpVsRead float64 `json:"catch_up_vs_log_read,omitempty"`
	LogRead       Row     `json:"log_read,omitzero"`
	Rebuild       Row     `json:"rebuild,omitzero"`
	EventsRead    Row     `json:"events_read,omitzero"`
}

// Round is one round of the pipeline section.
type Round struct {
	// Full and Bare are the pipelines' rates, events/s.
	Full float64 `json:"full_per_second"`
	Bare float64 `json:"bare_per_second"`
	// FullCPU and BareCPU are the machine's CPU time per event; 0 where
	// /proc/stat could not be read.
	FullCPU time.Duration `json:"full_cpu_per_event_ns"`
	BareCPU time.Duration `json:"bare_cpu_per_event_ns"`
}

// Ratio is Full/Bare.
func (r Round) Ratio() float64 { return r.Full / r.Bare }

// Row is one line of the table.
type Row struct {
	// Label says what was measured.
	Label string `json:"label"`
	// Events is how many events were measured, in Elapsed.
	Events  int           `json:"events"`
	Elapsed time.Duration `json:"elapsed_ns"`
	// PerSecond is Events / Elapsed; for a row of several rounds
	// (Rounds > 0), the median of the rounds' rates.
	PerSecond float64 `json:"per_second"`
	Rounds    int     `json:"rounds,omitempty"`
	// Ratio is PerSecond relative to the set-based fenced insert, for the
	// rows that insert events; zero for the others.
	Ratio float64 `json:"vs_set_insert,omitempty"`
	// Latency marks a latency row: P50 and P99 are set.
	Latency bool          `json:"latency,omitempty"`
	P50     time.Duration `json:"p50_ns,omitempty"`
	P99     time.Duration `json:"p99_ns,omitempty"`
	// Relative is the row's own comparison, to what RelativeTo names: the
	// full pipeline's to the bare one (median of the per-round ratios), a
	// latency's p99 to the bare pipeline's, the SDK's first second to the
	// rest of its run, a projector rate to a raw read of the same data.
	Relative   float64 `json:"relative,omitempty"`
	RelativeTo string  `json:"relative_to,omitempty"`
	// CPUPerEvent is the machine's CPU time per event (pipeline rows, and
	// the SDK's receipt row until its last receipt);
	// 0 when not measured.
	CPUPerEvent time.Duration `json:"cpu_per_event_ns,omitempty"`
}

// Machine describes the host, the Go runtime and the database of a run.
type Machine struct {
	CPUs        int    `json:"cpus"`
	MemoryBytes uint64 `json:"memory_bytes"` // 0 when unknown
	GOOS        string `json:"goos"`
	GOARCH      string `json:"goarch"`
	GoVersion   string `json:"go_version"`
	// PostgreSQL is the server's version (SHOW server_version).
	PostgreSQL string `json:"postgresql"`
	// Fsync and SynchronousCommit are the server's settings ("on", "off",
	// ...): with either off a commit does not wait for the disk, and the
	// rates are not those of a durable ledger. The throwaway cluster runs
	// with both off.
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	// Throwaway is true when the run used a throwaway cluster rather than
	// Options.DatabaseURL.
	Throwaway bool `json:"throwaway"`
}

func (m Machine) String() string {
	mem := "memory unknown"
	if m.MemoryBytes > 0 {
		mem = fmt.Sprintf("%.0f GiB", float64(m.MemoryBytes)/(1<<30))
	}
	db := "given database"
	if m.Throwaway {
		db = "throwaway cluster"
	}
	if m.Fsync != "" {
		db += fmt.Sprintf(", fsync %s, synchronous_commit %s", m.Fsync, m.SynchronousCommit)
	}
	return fmt.Sprintf("machine: %d CPUs, %s, %s/%s, %s, PostgreSQL %s (%s)",
		m.CPUs, mem, m.GOOS, m.GOARCH, m.GoVersion, m.PostgreSQL, db)
}

// Rows returns the measured rows in table order.
func (r Report) Rows() []Row {
	all := []Row{r.PerEventInsert, r.SetInsert, r.Copy, r.SchemaInsert, r.FenceAppend,
		r.FullPipeline, r.BarePipeline, r.HotPipeline,
		r.SDKReceipt, r.SDKFirstSecond, r.SDKSteady, r.SDKKV,
		r.LatencyRaw, r.LatencySDKAck, r.LatencySDKReceipt, r.LatencySDKKV, r.LatencyBare,
		r.Backlog, r.CatchUp, r.LogRead, r.Rebuild, r.EventsRead}
	return slices.DeleteFunc(all, func(row Row) bool { return row.Label == "" })
}

// Table renders the report: a machine line, one line per row (events/s,
// ratio to the set-based fenced insert, the row's own ratio, latency
// percentiles, CPU time per event) and lines describing the load.
func (r Report) Table() string {
	cells := [][]string{{"what", "events/s", "vs set-based insert", "ratio", "p50", "p99", "CPU/event"}}
	for _, row := range r.Rows() {
		c := []string{row.Label, group(int64(row.PerSecond + 0.5)), "", "", "", "", ""}
		if row.Ratio > 0 {
			c[2] = fmt.Sprintf("%.2f", row.Ratio)
		}
		if row.RelativeTo != "" {
			c[3] = fmt.Sprintf("%.2f × %s", row.Relative, row.RelativeTo)
		}
		if row.Latency {
			c[4], c[5] = formatLatency(row.P50), formatLatency(row.P99)
		}
		if row.CPUPerEvent > 0 {
			c[6] = fmt.Sprintf("%.0f µs", float64(row.CPUPerEvent)/float64(time.Microsecond))
		}
		cells = append(cells, c)
	}
	var b strings.Builder
	b.WriteString(r.Machine.String() + "\n")
	writeColumns(&b, cells)
	fmt.Fprintf(&b, "load: %s events a throughput phase (per-event INSERT: %s) over %s tasks on %d partitions, %d-byte JSON payloads\n",
		group(int64(r.Events)), group(int64(min(r.Events, PerEventMax))), group(int64(r.Tasks)), partitions, len(payload(10)))
	if r.LogBatches {
		b.WriteString("ingest: log batches (one LEDGER_LOG message per partition of a batch)\n")
	}
	if r.GCPercent > 0 {
		fmt.Fprintf(&b, "gc: GOGC %d in this process, as in the ingest and the projector by default\n", r.GCPercent)
	}
	if len(r.PipelineRounds) > 0 {
		ratios := make([]string, len(r.PipelineRounds))
		for i, rd := range r.PipelineRounds {
			ratios[i] = fmt.Sprintf("%.2f", rd.Ratio())
		}
		fmt.Fprintf(&b, "pipeline: %d rounds each, full then bare; full/bare by round %s", len(r.PipelineRounds), strings.Join(ratios, " "))
		if r.CPURatio > 0 {
			fmt.Fprintf(&b, "; machine CPU per event bare/full %.2f (medians)", r.CPURatio)
		}
		b.WriteString("; projector stopped\n")
	}
	if r.SDKReceipt.Label != "" {
		fmt.Fprintf(&b, "sdk: %d SDK workers, %s in flight per lease, fresh tasks; the projector runs and the workers read their receipts (the raw pipelines have neither)\n",
			r.Workers, group(MaxInFlight))
	}
	if r.CatchUpVsRead > 0 {
		fmt.Fprintf(&b, "projector: the backlog of %s events folded in %s, %.2f × the raw read of the same LEDGER_LOG messages\n",
			group(int64(r.CatchUp.Events)), r.CatchUp.Elapsed.Round(time.Millisecond), r.CatchUpVsRead)
	}
	if r.Rate > 0 {
		from := "given"
		if !r.RateGiven {
			from = fmt.Sprintf("half the full pipeline's %s events/s", group(int64(r.Saturation+0.5)))
		}
		fmt.Fprintf(&b, "latency: %s events a path at %s/s (%s); raw and bare alternate in two halves with the projector stopped, then the SDK with it\n",
			group(int64(latencyEvents(r.Rate, r.LatencyDuration))), group(int64(r.Rate)), from)
	}
	return b.String()
}

// Print writes Table to w.
func (r Report) Print(w io.Writer) error {
	_, err := io.WriteString(w, r.Table())
	return err
}

// writeColumns lays cells out in columns: the first left-aligned, the
// others right-aligned, widths counted in runes.
func writeColumns(b *strings.Builder, cells [][]string) {
	widths := make([]int, len(cells[0]))
	for _, row := range cells {
		for i, c := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, row := range cells {
		var line strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if i == 0 {
				line.WriteString(c + pad)
			} else {
				line.WriteString("   " + pad + c)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
}

func formatLatency(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2f ms", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f ms", ms)
	case ms < 10_000:
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func throughputRow(label string, n int, elapsed time.Duration) Row {
	return Row{Label: label, Events: n, Elapsed: elapsed, PerSecond: float64(n) / elapsed.Seconds()}
}

// latencyRow summarises latencies of events published over elapsed.
func latencyRow(label string, lat []time.Duration, published int, elapsed time.Duration) Row {
	slices.Sort(lat)
	row := throughputRow(label, published, elapsed)
	row.Latency = true
	row.P50, row.P99 = percentile(lat, 50), percentile(lat, 99)
	return row
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	k := (len(sorted)*p + 99) / 100 // ceil(n·p/100)
	return sorted[max(k, 1)-1]
}

// ratios sets the ratios that compare rows with each other.
func (r *Report) ratios() {
	if base := r.SetInsert.PerSecond; base > 0 {
		for _, row := range []*Row{&r.PerEventInsert, &r.SetInsert, &r.Copy, &r.SchemaInsert, &r.FenceAppend, &r.FullPipeline,
			&r.BarePipeline, &r.HotPipeline, &r.SDKReceipt, &r.SDKFirstSecond, &r.SDKSteady, &r.SDKKV} {
			if row.Label != "" {
				row.Ratio = row.PerSecond / base
			}
		}
	}
	if bare := r.LatencyBare.P99; bare > 0 {
		for _, row := range []*Row{&r.LatencyRaw, &r.LatencySDKAck, &r.LatencySDKReceipt, &r.LatencySDKKV} {
			if row.Label != "" {
				row.Relative, row.RelativeTo = float64(row.P99)/float64(bare), "bare p99"
			}
		}
	}
	relate := func(row *Row, base Row, to string) {
		if row.Label != "" && base.PerSecond > 0 {
			row.Relative, row.RelativeTo = row.PerSecond/base.PerSecond, to
		}
	}
	relate(&r.FenceAppend, r.SchemaInsert, "the same writes, set-based")
	relate(&r.CatchUp, r.Backlog, "commit rate")
	if r.CatchUp.Label != "" && r.LogRead.PerSecond > 0 {
		r.CatchUpVsRead = r.CatchUp.PerSecond / r.LogRead.PerSecond
	}
	relate(&r.Rebuild, r.EventsRead, "raw SELECT")
}
