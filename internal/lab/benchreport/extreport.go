package benchreport

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Table renders the external report: the machine, the load and its wall
// times, then one line per component with its CPU time, CPU time per event
// and the events per second one core of it carries, and the load average.
func (r ExternalReport) Table() string {
	var b strings.Builder
	b.WriteString(r.Machine.String() + "\n")
	kind := "SDK"
	if r.Raw {
		kind = "raw"
	}
	if l := r.Latency; l != nil {
		fmt.Fprintf(&b, "deployment: nats-server, ingest (no projector) and %d %s worker processes, and a bare pipeline, "+
			"each a process of its own; PostgreSQL a throwaway cluster%s\n", r.Workers, kind, rolesNote(r.Roles))
		rate := "given"
		if l.Saturation > 0 {
			rate = fmt.Sprintf("half the raw publishers' full-speed %s events/s", group(int64(l.Saturation+0.5)))
		}
		fmt.Fprintf(&b, "latency: %s events a path at %s events/s (%s), in two alternating halves\n",
			group(int64(r.Events)), group(int64(l.Rate)), rate)
		cells := [][]string{{"path", "events/s", "p50", "p99", "ratio"}}
		for _, row := range []Row{l.Path, l.Bare} {
			ratio := ""
			if row.RelativeTo != "" {
				ratio = fmt.Sprintf("%.2f × %s", row.Relative, row.RelativeTo)
			}
			cells = append(cells, []string{row.Label, group(int64(row.PerSecond + 0.5)), formatLatency(row.P50),
				formatLatency(row.P99), ratio})
		}
		writeColumns(&b, cells)
		if len(l.Stages) > 0 {
			warm := ""
			if !r.Raw {
				warm = "; with each task's first event, sent before the paced ones"
			}
			writeStages(&b, fmt.Sprintf("the ingest's stages on the %s path (ledger_ingest_stage_seconds; "+
				"p50 and p99 are bucket bounds%s):", kind, warm), l.Stages)
		}
		if r.Receipt.Label == "" {
			return b.String()
		}
		b.WriteString("the saturation run (raw publishers at full speed):\n")
	} else {
		fmt.Fprintf(&b, "deployment: nats-server, ingest, projector and %d %s worker processes, each a process of its own; "+
			"PostgreSQL a throwaway cluster%s\n", r.Workers, kind, rolesNote(r.Roles))
	}
	fmt.Fprintf(&b, "load: %s events over %s new tasks on %d partitions, %d-byte JSON payloads%s\n",
		group(int64(r.Events)), group(int64(r.Tasks)), partitions, len(payload(10)), warmupNote(r.Warmup))
	for _, row := range []Row{r.Receipt, r.Projected} {
		if row.Label == "" {
			continue
		}
		ratio := ""
		if row.RelativeTo != "" {
			ratio = fmt.Sprintf(", %.2f × %s", row.Relative, row.RelativeTo)
		}
		fmt.Fprintf(&b, "%s: %.2f s, %s events/s%s\n", row.Label, row.Elapsed.Seconds(), group(int64(row.PerSecond+0.5)), ratio)
	}
	if f := r.Floor; f.Label != "" {
		fmt.Fprintf(&b, "%s, after the run: %.2f s, %s events/s\n", f.Label, f.Elapsed.Seconds(), group(int64(f.PerSecond+0.5)))
	}
	if f, rest := r.FirstWindow, r.AfterFirstWindow; f.Label != "" {
		fmt.Fprintf(&b, "receipts in the %s: %s events/s, %.2f × the %s events/s after it\n", f.Label,
			group(int64(f.PerSecond+0.5)), f.Relative, group(int64(rest.PerSecond+0.5)))
	}
	cells := [][]string{{"component", "processes", "CPU time", "CPU/event", "one core carries"}}
	for _, c := range append(append([]Component(nil), r.Components...), r.Total) {
		carries := "-"
		if c.PerCore > 0 {
			carries = group(int64(c.PerCore+0.5)) + " events/s"
		}
		cells = append(cells, []string{c.Name, fmt.Sprint(c.Processes), fmt.Sprintf("%.2f s", c.CPU.Seconds()),
			formatMicros(c.PerEvent), carries})
	}
	writeColumns(&b, cells)
	until := "the last receipt and the projector's last ack"
	if r.Projected.Label == "" {
		until = "the last receipt"
	}
	fmt.Fprintf(&b, "CPU time from /proc/<pid>/stat (10 ms ticks) over the window from the first publish to %s; "+
		"load average %s before, %s after, on %d CPUs\n", until, formatLoad(r.LoadBefore), formatLoad(r.LoadAfter), r.Machine.CPUs)
	if len(r.Stages) > 0 {
		writeStages(&b, "the ingest's stages over the same window (ledger_ingest_stage_seconds; p50 and p99 are bucket bounds):", r.Stages)
	}
	if r.IngestProfile != "" {
		fmt.Fprintf(&b, "ingest CPU profile (its whole life): %s (go tool pprof -top <bin>/ingest %s)\n", r.IngestProfile, r.IngestProfile)
	}
	if r.ProjectorProfile != "" {
		fmt.Fprintf(&b, "projector CPU profile (its whole life): %s (go tool pprof -top <bin>/projector %s)\n",
			r.ProjectorProfile, r.ProjectorProfile)
	}
	if r.WorkerProfile != "" {
		fmt.Fprintf(&b, "worker 0's CPU profile (its whole life): %s (go tool pprof -top <bin>/ledgerlab %s)\n",
			r.WorkerProfile, r.WorkerProfile)
	}
	return b.String()
}

// warmupNote says how the ledger was warmed up before the run.
func warmupNote(n int) string {
	if n <= 0 {
		return "; no warm-up: the services' own first second is in the run"
	}
	return fmt.Sprintf("; the ledger warmed up first with %s events of other tasks", group(int64(n)))
}

// Print writes Table to w.
func (r ExternalReport) Print(w io.Writer) error {
	_, err := io.WriteString(w, r.Table())
	return err
}

func formatMicros(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	if us < 10 {
		return fmt.Sprintf("%.1f µs", us)
	}
	return fmt.Sprintf("%.0f µs", us)
}

func formatLoad(l float64) string {
	if l < 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.2f", l)
}

// writeStages writes a table of the ingest's stages under title.
func writeStages(b *strings.Builder, title string, rows []StageRow) {
	b.WriteString(title + "\n")
	cells := [][]string{{"stage", "counted", "mean", "p50 ≤", "p99 ≤"}}
	for _, st := range rows {
		cells = append(cells, []string{st.Stage, group(int64(st.Count)), formatLatency(st.Mean),
			formatBound(st.P50), formatBound(st.P99)})
	}
	writeColumns(b, cells)
}

// formatBound is a stage's percentile bound: beyond the last bucket, said so.
func formatBound(d time.Duration) string {
	if d == time.Duration(math.MaxInt64) {
		return "beyond the buckets"
	}
	return formatLatency(d)
}

// rolesNote says who the services connected to PostgreSQL as.
func rolesNote(roles bool) string {
	if roles {
		return "; the ingest and the projector as users in ledger_ingest and ledger_projector (the database's fence checks them)"
	}
	return "; the ingest and the projector as the schema's owner (the database's fence checks nothing)"
}
