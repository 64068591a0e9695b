package benchreport

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Labels of the throughput rows, as the table prints them.
const (
	LabelPerEventInsert  = "per-event fenced INSERT (1 conn)"
	LabelSetInsert       = "set-based fenced insert (1000/batch)"
	LabelCopy            = "COPY (1000/batch)"
	LabelFenceAppend     = "fence.Append (1000/batch, all checks)"
	LabelPipelineReceipt = "pipeline: SDK → ingest → receipt"
	LabelPipelineKV      = "pipeline: SDK → ingest → projector KV"
)

// Report is the outcome of a run: one Row per line of the table.
type Report struct {
	// Machine describes where the run ran.
	Machine Machine
	// Events, Tasks, Workers, Rate and LatencyDuration are the load the run
	// used (Options with defaults applied; Tasks is how many tasks each
	// phase spread its events over).
	Events, Tasks, Workers, Rate int
	LatencyDuration              time.Duration

	// The raw baselines, each on one connection: a fenced INSERT per event
	// (autocommit), a set-based fenced insert and COPY, both 1,000 events a
	// batch, into the scratch schema ledger_bench; and fence.Append, the
	// ledger's own append with every check, into ledger.events.
	PerEventInsert, SetInsert, Copy, FenceAppend Row
	// The full pipeline at full speed: Workers SDK clients publish Events
	// events over new tasks (so each task's first event waits for the SDK
	// to learn its head, as with any fresh worker); rates from the first
	// publish to the last commit receipt, and to the moment the bucket
	// ledger_tasks holds every task at its last version.
	PipelineReceipt, PipelineKV Row
	// The full pipeline at a paced Rate for LatencyDuration: latency from
	// each event's publish to its JetStream ack (LEDGER_IN stored it), to
	// its commit receipt, and to the first bucket value of its task at its
	// version or later. Their Events/PerSecond are the events published and
	// the rate achieved.
	LatencyAck, LatencyReceipt, LatencyKV Row
}

// Row is one line of the table.
type Row struct {
	// Label says what was measured.
	Label string
	// Events is how many events were measured, in Elapsed.
	Events  int
	Elapsed time.Duration
	// PerSecond is Events / Elapsed.
	PerSecond float64
	// Ratio is PerSecond relative to the set-based fenced insert; zero for
	// latency rows.
	Ratio float64
	// Latency marks a latency row: P50 and P99 are set, Ratio is not.
	Latency bool
	// P50 and P99 are the latency percentiles of a latency row.
	P50, P99 time.Duration
}

// Machine describes the host, the Go runtime and the database of a run.
type Machine struct {
	CPUs         int
	MemoryBytes  uint64 // 0 when unknown
	GOOS, GOARCH string
	GoVersion    string
	// PostgreSQL is the server's version (SHOW server_version).
	PostgreSQL string
	// Fsync and SynchronousCommit are the server's settings ("on", "off",
	// ...): with either off a commit does not wait for the disk, and the
	// rates are not those of a durable ledger. The throwaway cluster runs
	// with both off.
	Fsync, SynchronousCommit string
	// Throwaway is true when the run used a throwaway cluster rather than
	// Options.DatabaseURL.
	Throwaway bool
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

// Rows returns the rows in table order.
func (r Report) Rows() []Row {
	return []Row{r.PerEventInsert, r.SetInsert, r.Copy, r.FenceAppend, r.PipelineReceipt, r.PipelineKV,
		r.LatencyAck, r.LatencyReceipt, r.LatencyKV}
}

// Table renders the report: a machine line, one line per row (events/s,
// ratio to the set-based fenced insert, latency percentiles) and a line
// describing the load.
func (r Report) Table() string {
	cells := [][]string{{"what", "events/s", "vs set-based insert", "p50", "p99"}}
	for _, row := range r.Rows() {
		c := []string{row.Label, group(int64(row.PerSecond + 0.5)), "", "", ""}
		if row.Latency {
			c[3], c[4] = formatLatency(row.P50), formatLatency(row.P99)
		} else {
			c[2] = fmt.Sprintf("%.2f", row.Ratio)
		}
		cells = append(cells, c)
	}
	var b strings.Builder
	b.WriteString(r.Machine.String() + "\n")
	writeColumns(&b, cells)
	fmt.Fprintf(&b, "load: %s events per throughput phase (per-event INSERT: %s) over %s tasks on %d partitions, "+
		"%d-byte JSON payloads; pipeline: %d SDK workers, %s in flight per lease; latency: %s events at %s/s\n",
		group(int64(r.Events)), group(int64(min(r.Events, PerEventMax))), group(int64(r.Tasks)), partitions,
		len(payload(10)), r.Workers, group(MaxInFlight), group(int64(r.LatencyReceipt.Events)), group(int64(r.Rate)))
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

// ratios sets every throughput row's Ratio to the set-based insert.
func (r *Report) ratios() {
	base := r.SetInsert.PerSecond
	for _, row := range []*Row{&r.PerEventInsert, &r.SetInsert, &r.Copy, &r.FenceAppend, &r.PipelineReceipt, &r.PipelineKV} {
		if base > 0 {
			row.Ratio = row.PerSecond / base
		}
	}
}
