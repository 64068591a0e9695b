package chaos

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// PrintFailover writes a failover measurement as three tables: the
// failover times after kill -9, the takeovers after pauses, and what
// renewals cost.
func PrintFailover(w io.Writer, rep *FailoverReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "ledgerlab chaos failover: %d kill trials per TTL, %d pause trials per TTL and pause, %d CPUs, seed %d, %v\n\n",
		rep.Trials, rep.PauseTrials, rep.CPUs, rep.Seed, (time.Duration(rep.Seconds * float64(time.Second))).Round(time.Second))

	fmt.Fprintln(tw, "Failover: kill -9 of the holder to the standby's first committed event")
	fmt.Fprintln(tw, "TTL\tp50\tp90\tmax\tgrant p50\tmissed\tload (1 min) before/after\t")
	for _, t := range rep.TTLs {
		fmt.Fprintf(tw, "%v\t%s\t%s\t%s\t%s\t%d\t%s/%s\t\n", t.TTL(), ms(t.Failover.P50), ms(t.Failover.P90), ms(t.Failover.Max),
			ms(t.Grant.P50), t.Missed, load(t.LoadBefore), load(t.LoadAfter))
	}

	fmt.Fprintln(tw, "\nFalse takeovers: SIGSTOP of the live holder, then SIGCONT (takeovers/trials; +n: leases lost")
	fmt.Fprintln(tw, "without a takeover, the renewal came after the local deadline)")
	var head strings.Builder
	head.WriteString("TTL\t")
	if len(rep.TTLs) > 0 {
		for _, p := range rep.TTLs[0].Pauses {
			fmt.Fprintf(&head, "%v\t", time.Duration(p.PauseMillis)*time.Millisecond)
		}
	}
	fmt.Fprintln(tw, head.String())
	for _, t := range rep.TTLs {
		fmt.Fprintf(tw, "%v\t", t.TTL())
		for _, p := range t.Pauses {
			cell := fmt.Sprintf("%d/%d", p.Takeovers, p.Trials)
			if n := p.Lost - p.Takeovers; n > 0 {
				cell += fmt.Sprintf(" +%d", n)
			}
			fmt.Fprintf(tw, "%s\t", cell)
		}
		fmt.Fprintln(tw)
	}

	fmt.Fprintln(tw, "\nRenewals: the SDK renews every TTL/3; PostgreSQL's side of one renewal, measured")
	fmt.Fprintln(tw, "TTL\trenewals/s per lease\tround trip\tserver CPU\tPostgreSQL cores per 1000 leases\t")
	for _, t := range rep.TTLs {
		cpu, cores := "-", "-"
		if t.Renewal.CPUMicros >= 0 {
			cpu = fmt.Sprintf("%.0fµs", t.Renewal.CPUMicros)
			cores = fmt.Sprintf("%.2f", 1000*t.RenewalsPerSecond*t.Renewal.CPUMicros/1e6)
		}
		fmt.Fprintf(tw, "%v\t%.2f\t%.0fµs\t%s\t%s\t\n", t.TTL(), t.RenewalsPerSecond, t.Renewal.RoundTripMicros, cpu, cores)
	}
	if rep.Dir != "" {
		fmt.Fprintf(tw, "\nlogs in %s\n", rep.Dir)
	}
	return tw.Flush()
}

// ms formats milliseconds: "-" for none.
func ms(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0fms", v)
}

func load(l float64) string {
	if l < 0 {
		return "?"
	}
	return fmt.Sprintf("%.1f", l)
}
