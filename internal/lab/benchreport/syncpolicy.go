package benchreport

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flowness/ledger/internal/lab/chaos"
)

// SyncPolicy is JetStream's durability settings against one another in the
// deployment's shape, measured in one invocation: sync_interval always
// against the server's default (a sync every 2 min), each on one node (R1)
// and on a three-node cluster (R3). Each setting runs on a fresh
// deployment: a throughput run at full speed, then a latency run at one
// rate, the same for every setting.
type SyncPolicy struct {
	// Rate is the latency runs' offered load, events/s.
	Rate int `json:"rate"`
	// Settings are the runs, R1 default first: the baseline of the ratios.
	Settings []SyncSetting `json:"settings"`
}

// SyncSetting is one setting's measurement.
type SyncSetting struct {
	Label      string `json:"label"`
	Replicas   int    `json:"replicas"`
	SyncAlways bool   `json:"sync_always"`
	// PerSecond is the throughput run's receipt rate; Throughput it over
	// the baseline's.
	PerSecond  float64 `json:"events_per_second"`
	Throughput float64 `json:"throughput_vs_baseline"`
	// P50 and P99 are publish → receipt at the common rate; P99Ratio the
	// p99 over the baseline's.
	P50      time.Duration `json:"p50_ns"`
	P99      time.Duration `json:"p99_ns"`
	P99Ratio float64       `json:"p99_vs_baseline"`
}

// RunSyncPolicy measures the four settings with o's load. The latency runs
// offer o.Rate, or half the baseline's throughput when it is 0.
func RunSyncPolicy(ctx context.Context, o ExternalOptions) (SyncPolicy, error) {
	rate := o.Rate
	o.Rate, o.Latency = 0, false // the runs pace themselves below
	o = o.WithDefaults()
	if err := o.validate(); err != nil {
		return SyncPolicy{}, err
	}
	settings := []SyncSetting{
		{Label: "R1, sync default", Replicas: 1},
		{Label: "R1, sync always", Replicas: 1, SyncAlways: true},
		{Label: "R3, sync default", Replicas: 3},
		{Label: "R3, sync always", Replicas: 3, SyncAlways: true},
	}
	sp := SyncPolicy{Rate: rate}
	for i := range settings {
		s := &settings[i]
		if err := measureSetting(ctx, o, s, &sp.Rate); err != nil {
			return SyncPolicy{}, fmt.Errorf("benchreport: %s: %w", s.Label, err)
		}
		base := settings[0]
		s.Throughput = s.PerSecond / base.PerSecond
		if base.P99 > 0 {
			s.P99Ratio = float64(s.P99) / float64(base.P99)
		}
	}
	sp.Settings = settings
	return sp, nil
}

// measureSetting runs one setting on a deployment of its own. A zero rate
// is set to half this setting's throughput.
func measureSetting(ctx context.Context, o ExternalOptions, s *SyncSetting, rate *int) error {
	prog := newProgress(o.Progress)
	defer prog.close()
	prog.say("%s: starting a deployment", s.Label)
	do := chaos.DeploymentOptions{Bin: o.Bin, Progress: sayWriter{prog},
		Cluster: s.Replicas == 3, NATSSyncAlways: s.SyncAlways, Roles: o.Roles}
	if o.LogBatches {
		do.IngestArgs = []string{"-log-batches"}
	}
	d, err := chaos.StartDeployment(ctx, do)
	if err != nil {
		return err
	}
	e := &external{o: o, id: runID(), d: d, prog: prog}
	err = e.measure(ctx, s, rate)
	if n := d.Exits(); err == nil && n > 0 {
		err = fmt.Errorf("%d service processes exited during the run", n)
	}
	if err != nil {
		d.Stop(true)
		return fmt.Errorf("%w (logs in %s)", err, d.Dir())
	}
	d.Stop(false)
	return nil
}

func (e *external) measure(ctx context.Context, s *SyncSetting, rate *int) error {
	r, err := e.run(ctx)
	if err != nil {
		return err
	}
	s.PerSecond = r.Receipt.PerSecond
	if *rate == 0 {
		*rate = max(int(s.PerSecond/2), 1)
	}
	lat := latencies{}
	if _, err := e.paced(ctx, workerSpec{id: runID(), workers: e.o.Workers, events: e.o.Events, rate: *rate,
		tasks: e.o.Tasks, raw: e.o.Raw}, lat); err != nil {
		return err
	}
	s.P50, s.P99 = lat.percentile(50), lat.percentile(99)
	return nil
}

// Print writes the table.
func (sp SyncPolicy) Print(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "JetStream sync policy and replicas (latency at %s events/s; ratios to R1, sync default)\n", group(int64(sp.Rate)))
	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "setting\tevents/s\tvs baseline\tp50\tp99\tp99 vs baseline\t")
	for _, s := range sp.Settings {
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%s\t%.2f\t\n", s.Label, group(int64(s.PerSecond+0.5)), s.Throughput,
			formatMicros(s.P50), formatMicros(s.P99), s.P99Ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}
