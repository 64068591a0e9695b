package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/flowness/ledger/internal/lab/procstat"
	"github.com/flowness/ledger/pkg/wire"
)

// Defaults of FailoverOptions.
const (
	// FailoverTrialsDefault is the number of kill -9 trials per TTL: 20.
	FailoverTrialsDefault = 20
	// PauseTrialsDefault is the number of SIGSTOP trials per TTL and pause
	// length: 10.
	PauseTrialsDefault = 10
	// FailoverRateDefault is the events per second of a holding writer in a
	// failover measurement: 100. A standby's first event leaves up to 1/rate
	// after its grant, so the rate bounds what it adds to a failover time
	// (10 ms).
	FailoverRateDefault = 100
)

// FailoverTTLsDefault are the TTLs a failover measurement compares: 500 ms,
// 1 s, 3 s (the ledger's default) and 10 s.
var FailoverTTLsDefault = []time.Duration{500 * time.Millisecond, time.Second, 3 * time.Second, 10 * time.Second}

// PausesDefault are the pause lengths of a failover measurement's SIGSTOP
// trials: 100 ms, 250 ms, 500 ms, 1 s and 2 s, from a long GC pause to a
// stalled VM.
var PausesDefault = []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second}

// Bounds of a failover measurement's settings.
const (
	maxTrials = 1000
	maxPause  = time.Minute
)

// FailoverOptions configure a failover measurement (RunFailover). The zero
// value measures the defaults.
type FailoverOptions struct {
	// TTLs are the lease TTLs measured, each with a stack of its own;
	// default FailoverTTLsDefault.
	TTLs []time.Duration
	// Pauses are the lengths of the SIGSTOP trials; default PausesDefault.
	Pauses []time.Duration
	// Trials is the number of kill -9 trials per TTL; default 20.
	Trials int
	// PauseTrials is the number of SIGSTOP trials per TTL and pause; default
	// 10.
	PauseTrials int
	// Rate is the events per second of the holding writer; default 100.
	Rate float64
	// Seed fixes when in the renewal cycle each fault lands; 0 picks one.
	Seed uint64
	// Bin is the directory holding the ingest and ledgerlab binaries;
	// default the directory of the running executable.
	Bin string
	// Ledgerlab overrides Bin/ledgerlab, which runs the writers and NATS.
	Ledgerlab string
	// Dir keeps the logs and data of every TTL's stack; default a temporary
	// directory, removed after a measurement without errors or missed
	// failovers.
	Dir string
	// Progress receives every stack's run log and every trial as it
	// happens; default discards.
	Progress io.Writer
}

// WithDefaults returns o with every zero field set to its default.
func (o FailoverOptions) WithDefaults() FailoverOptions {
	if len(o.TTLs) == 0 {
		o.TTLs = slices.Clone(FailoverTTLsDefault)
	}
	if len(o.Pauses) == 0 {
		o.Pauses = slices.Clone(PausesDefault)
	}
	o.Trials = cmp.Or(o.Trials, FailoverTrialsDefault)
	o.PauseTrials = cmp.Or(o.PauseTrials, PauseTrialsDefault)
	o.Rate = cmp.Or(o.Rate, FailoverRateDefault)
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// Validate reports the first setting that cannot run.
func (o FailoverOptions) Validate() error {
	for _, ttl := range o.TTLs {
		if ttl < wire.TTLMinMillis*time.Millisecond || ttl > wire.TTLMaxMillis*time.Millisecond || ttl%time.Millisecond != 0 {
			return fmt.Errorf("a TTL must be whole milliseconds in [%dms, %dms], got %v", wire.TTLMinMillis, wire.TTLMaxMillis, ttl)
		}
	}
	for _, p := range o.Pauses {
		if p <= 0 || p > maxPause {
			return fmt.Errorf("a pause must be in (0, %v], got %v", maxPause, p)
		}
	}
	switch {
	case o.Trials < 1 || o.Trials > maxTrials:
		return fmt.Errorf("kill trials must be 1..%d, got %d", maxTrials, o.Trials)
	case o.PauseTrials < 1 || o.PauseTrials > maxTrials:
		return fmt.Errorf("pause trials must be 1..%d, got %d", maxTrials, o.PauseTrials)
	case o.Rate <= 0 || math.IsInf(o.Rate, 0) || math.IsNaN(o.Rate):
		return errors.New("the rate must be positive")
	}
	return nil
}

// FailoverReport is what a failover measurement found.
type FailoverReport struct {
	// Seed placed the faults in the renewal cycles.
	Seed uint64 `json:"seed"`
	// CPUs is the machine's CPU count.
	CPUs int `json:"cpus"`
	// Trials and PauseTrials are the trials asked for.
	Trials      int `json:"trials"`
	PauseTrials int `json:"pause_trials"`
	// Seconds is how long the whole measurement took.
	Seconds float64 `json:"seconds"`
	// TTLs has one entry per TTL, in the order measured.
	TTLs []TTLReport `json:"ttls"`
	// Dir is where the logs are; empty once removed.
	Dir string `json:"dir,omitempty"`
}

// TTLReport is the measurement of one TTL.
type TTLReport struct {
	// TTLMillis is the lease TTL measured, in milliseconds.
	TTLMillis int64 `json:"ttl_ms"`
	// Kills are the kill -9 trials that ended in a failover.
	Kills []KillTrial `json:"kills"`
	// Missed counts kill -9 trials after which no standby committed
	// within the bound (10 TTLs + 10 s).
	Missed int `json:"missed"`
	// Failover summarises the kills' FailoverMillis, Grant their
	// GrantMillis.
	Failover Summary `json:"failover_ms"`
	Grant    Summary `json:"grant_ms"`
	// Pauses are the SIGSTOP trials, by pause length.
	Pauses []PauseResult `json:"pauses"`
	// RenewalsPerSecond is what one lease costs in renewals: 3/TTL, the
	// SDK's cadence.
	RenewalsPerSecond float64 `json:"renewals_per_second_per_lease"`
	// Renewal is the measured cost of one renewal in PostgreSQL.
	Renewal RenewalCost `json:"renewal"`
	// Load is the machine's 1-minute load average when the TTL's trials
	// began and ended (-1: unknown).
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
}

// TTL is the lease TTL measured.
func (t TTLReport) TTL() time.Duration { return time.Duration(t.TTLMillis) * time.Millisecond }

// KillTrial is one kill -9 of the holding writer.
type KillTrial struct {
	// Killed is the holder killed, Generation its generation.
	Killed     string `json:"killed"`
	Generation int64  `json:"generation"`
	// Standby is the holder that took over.
	Standby string `json:"standby"`
	// GrantMillis is the time from the kill to the standby's grant
	// (ledger.lease_grants.granted_at), FailoverMillis to its first
	// committed event (ledger.events.committed_at). Both are read from the
	// database clock, the kill from the orchestrator's: one host, one
	// clock.
	GrantMillis    float64 `json:"grant_ms"`
	FailoverMillis float64 `json:"failover_ms"`
}

// Summary is the distribution of a trial's times, in milliseconds
// (nearest-rank percentiles; zero without trials).
type Summary struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	Max float64 `json:"max"`
}

// PauseResult counts the SIGSTOP trials of one pause length.
type PauseResult struct {
	PauseMillis int64 `json:"pause_ms"`
	Trials      int   `json:"trials"`
	// Takeovers counts trials after which the other writer was granted the
	// partition: a false takeover, the paused writer was alive.
	Takeovers int `json:"takeovers"`
	// Lost counts trials after which the paused writer no longer held its
	// generation, takeovers included: without a takeover, its renewal
	// came after its local deadline, and it acquired the partition again
	// under a new generation.
	Lost int `json:"lost"`
}

// RenewalCost is the PostgreSQL side of renewals, measured by renewing a
// lease of its own back to back on one connection for about a second.
type RenewalCost struct {
	// N renewals were measured.
	N int `json:"n"`
	// RoundTripMicros is the mean time of one, as its client saw it.
	RoundTripMicros float64 `json:"round_trip_us"`
	// CPUMicros is the mean CPU time the server process serving the
	// connection spent on one (user and system, from /proc); -1 when
	// /proc could not tell.
	CPUMicros float64 `json:"server_cpu_us"`
}

// RunFailover measures, for each TTL, the time from kill -9 of a holding
// writer to its standby's first committed event, and how often a pause
// (SIGSTOP, then SIGCONT) of a live holder costs it its lease. Each TTL gets
// a stack of its own: a throwaway PostgreSQL, NATS, one ingest and two
// writers of one partition, each the other's standby; a killed writer is
// replaced by a new one, the next standby. The error is about the
// measurement itself; a trial without a failover is counted in Missed.
func RunFailover(ctx context.Context, o FailoverOptions) (*FailoverReport, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Seed == 0 {
		o.Seed = randomSeed()
	}
	keep := o.Dir != ""
	dir := o.Dir
	var err error
	if keep {
		err = os.MkdirAll(dir, 0o755)
	} else {
		dir, err = os.MkdirTemp("", "ledger-failover-")
	}
	if err != nil {
		return nil, fmt.Errorf("failover: work directory: %w", err)
	}
	began := time.Now()
	rep := &FailoverReport{Seed: o.Seed, CPUs: runtime.NumCPU(), Trials: o.Trials, PauseTrials: o.PauseTrials, Dir: dir}
	rng := seeded(o.Seed)
	missed := 0
	for _, ttl := range o.TTLs {
		tr, err := measureTTL(ctx, o, ttl, filepath.Join(dir, "ttl-"+ttl.String()), rng.Uint64())
		if err != nil {
			return nil, fmt.Errorf("failover: TTL %v: %w (logs in %s)", ttl, err, dir)
		}
		missed += tr.Missed
		rep.TTLs = append(rep.TTLs, *tr)
	}
	rep.Seconds = time.Since(began).Seconds()
	if !keep && missed == 0 {
		os.RemoveAll(dir)
		rep.Dir = ""
	}
	return rep, nil
}

// failover is the measurement of one TTL in progress.
type failover struct {
	*run
	ttl time.Duration
	// next is the number of the next writer started.
	next int
	// held holds the writers whose logs show a refused acquire: a log only
	// grows, so each is read until it shows one, not on every poll after.
	held map[string]bool
}

// failoverPartition is the writers' partition; the next one is the
// renewal cost probe's.
const failoverPartition = 0

func measureTTL(ctx context.Context, o FailoverOptions, ttl time.Duration, dir string, seed uint64) (*TTLReport, error) {
	ro := Options{Partitions: 2, Writers: 2, Tasks: 1, Ingests: 1, TTL: ttl, Rate: o.Rate, Zombie: Off,
		Bin: o.Bin, Ledgerlab: o.Ledgerlab, Dir: dir, Progress: o.Progress}.WithDefaults()
	r := newRun(ro)
	r.noProjector, r.rng = true, seeded(seed)
	if err := r.findBinaries(); err != nil {
		return nil, err
	}
	if err := r.makeDir(); err != nil {
		return nil, err
	}
	defer r.runLog.Close()
	defer r.teardown()
	f := &failover{run: r, ttl: ttl, held: map[string]bool{}}
	r.logf("failover: TTL %v, run %s, in %s", ttl, r.id, r.dir)
	if err := r.startStack(ctx); err != nil {
		return nil, err
	}
	tr := &TTLReport{TTLMillis: ttl.Milliseconds(), RenewalsPerSecond: 3 / ttl.Seconds()}
	var err error
	if tr.Renewal, err = f.renewalCost(ctx); err != nil {
		return nil, err
	}
	for range 2 {
		if err := f.startWriter(); err != nil {
			return nil, err
		}
	}
	r.start = time.Now()
	tr.LoadBefore = procstat.LoadAverage()
	for i := range o.Trials {
		k, err := f.killTrial(ctx)
		if err != nil {
			return nil, fmt.Errorf("kill trial %d: %w", i+1, err)
		}
		if k == nil {
			tr.Missed++
		} else {
			tr.Kills = append(tr.Kills, *k)
		}
	}
	tr.Pauses = make([]PauseResult, len(o.Pauses))
	// Round by round, so that a change of the machine's load falls on
	// every pause length alike.
	for i := range o.PauseTrials {
		for j, d := range o.Pauses {
			took, lost, err := f.pauseTrial(ctx, d)
			if err != nil {
				return nil, fmt.Errorf("pause trial %d of %v: %w", i+1, d, err)
			}
			p := &tr.Pauses[j]
			p.PauseMillis, p.Trials = d.Milliseconds(), p.Trials+1
			if took {
				p.Takeovers++
			}
			if lost {
				p.Lost++
			}
		}
	}
	tr.LoadAfter = procstat.LoadAverage()
	var fo, gr []float64
	for _, k := range tr.Kills {
		fo, gr = append(fo, k.FailoverMillis), append(gr, k.GrantMillis)
	}
	tr.Failover, tr.Grant = summarize(fo), summarize(gr)
	r.logf("failover: TTL %v done: failover p50 %.0fms, %d missed", ttl, tr.Failover.P50, tr.Missed)
	return tr, nil
}

// startWriter starts the next writer of the partition.
func (f *failover) startWriter() error {
	_, err := f.run.startWriter(failoverPartition, f.next)
	f.next++
	return err
}

// lease is the partition's lease and the ledger's newest event.
type lease struct {
	holder     string
	generation int64
	expiresAt  time.Time
	valid      bool
	// seq and gen are the newest event's.
	seq, gen int64
}

func (f *failover) lease(ctx context.Context) (lease, error) {
	var l lease
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := f.pool.QueryRow(qctx, sqlFailoverLease, failoverPartition).Scan(&l.holder, &l.generation, &l.expiresAt, &l.valid, &l.seq, &l.gen)
	if err != nil {
		return l, fmt.Errorf("read the lease: %w", err)
	}
	return l, nil
}

// steady waits until a writer holds the partition and has committed under
// its generation, and every other live writer has been refused the
// partition at least once (it waits as a standby). It returns that lease.
func (f *failover) steady(ctx context.Context) (*proc, lease, error) {
	deadline := time.Now().Add(10*f.ttl + 30*time.Second)
	for {
		l, err := f.lease(ctx)
		if err == nil && l.valid && l.gen == l.generation {
			if h := f.holderOf[l.holder]; h != nil && h.running() && f.standbysReady(h) {
				return h, l, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, l, fmt.Errorf("no writer held the partition with a standby and a commit within %v (last: %+v, %v)",
				10*f.ttl+30*time.Second, l, err)
		}
		if !sleep(ctx, 10*time.Millisecond) {
			return nil, l, ctx.Err()
		}
	}
}

// standbysReady reports whether every live writer but h has logged a
// refused acquire.
func (f *failover) standbysReady(h *proc) bool {
	for _, w := range f.writers {
		if w == h || !w.running() {
			continue
		}
		if !f.loggedHeld(w.name) {
			return false
		}
	}
	return true
}

func (f *failover) loggedHeld(holder string) bool {
	if f.held[holder] {
		return true
	}
	file, err := os.Open(f.writerLog(holder))
	if err != nil {
		return false
	}
	defer file.Close()
	wl, err := ReadLog(holder, file)
	if err != nil {
		return false
	}
	for _, rec := range wl.Records {
		if rec.Kind == KindHeld {
			f.held[holder] = true
			return true
		}
	}
	return false
}

// somewhereInTheCycle waits a random part of a renewal interval (TTL/3), so
// that a fault lands anywhere in the holder's renewal cycle, as a crash or
// a GC pause would.
func (f *failover) somewhereInTheCycle(ctx context.Context) bool {
	return sleep(ctx, time.Duration(f.uniform(0, float64(f.ttl/3))))
}

// killTrial kills the holder with SIGKILL, waits for the standby's first
// commit, and starts a new writer as the next standby. A nil trial is a
// failover that did not come within 10 TTLs + 10 s.
func (f *failover) killTrial(ctx context.Context) (*KillTrial, error) {
	h, l, err := f.steady(ctx)
	if err != nil {
		return nil, err
	}
	if !f.somewhereInTheCycle(ctx) {
		return nil, ctx.Err()
	}
	killedAt := time.Now()
	h.kill()
	k, err := f.firstCommitAfter(ctx, l, killedAt)
	if err != nil {
		return nil, err
	}
	if k == nil {
		f.logf("kill -9 %s (generation %d): no standby committed within %v", h.name, l.generation, 10*f.ttl+10*time.Second)
	} else {
		f.logf("kill -9 %s (generation %d): %s granted after %.0fms, first commit after %.0fms",
			h.name, l.generation, k.Standby, k.GrantMillis, k.FailoverMillis)
	}
	return k, f.startWriter()
}

// firstCommitAfter waits for the first commit of a later generation than
// l's, after l's newest event.
func (f *failover) firstCommitAfter(ctx context.Context, l lease, killedAt time.Time) (*KillTrial, error) {
	bound := 10*f.ttl + 10*time.Second
	for time.Since(killedAt) < bound {
		var standby string
		var gen int64
		var committed, granted time.Time
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := f.pool.QueryRow(qctx, sqlFirstCommitAfter, failoverPartition, l.seq, l.generation).
			Scan(&standby, &gen, &committed, &granted)
		cancel()
		if err == nil {
			if standby == l.holder {
				return nil, fmt.Errorf("generation %d was granted to the killed holder %s", gen, l.holder)
			}
			return &KillTrial{Killed: l.holder, Generation: l.generation, Standby: standby,
				GrantMillis: millis(granted.Sub(killedAt)), FailoverMillis: millis(committed.Sub(killedAt))}, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		sleep(ctx, 10*time.Millisecond)
	}
	return nil, nil
}

// pauseTrial stops the holder with SIGSTOP for d, wakes it with SIGCONT,
// and waits until the pause's outcome is settled: a later generation was
// granted (lost; a takeover if to another writer), or the woken holder
// renewed its generation.
func (f *failover) pauseTrial(ctx context.Context, d time.Duration) (takeover, lost bool, err error) {
	h, l, err := f.steady(ctx)
	if err != nil {
		return false, false, err
	}
	if !f.somewhereInTheCycle(ctx) {
		return false, false, ctx.Err()
	}
	if err := h.signal(syscall.SIGSTOP); err != nil {
		return false, false, err
	}
	sleep(ctx, d)
	wokeAt := time.Now()
	if err := h.signal(syscall.SIGCONT); err != nil {
		return false, false, err
	}
	takeover, lost, err = f.settle(ctx, l, wokeAt)
	outcome := "kept its lease"
	switch {
	case err != nil:
		return false, false, err
	case takeover:
		outcome = "lost its lease to the standby"
	case lost:
		outcome = "lost its lease and acquired the partition again"
	}
	f.logf("sigstop %s (generation %d) for %v: %s", h.name, l.generation, d, outcome)
	return takeover, lost, nil
}

// settleAfterWake is how long a woken holder's generation must stay
// renewed before it counts as kept: a woken writer acts at once (its
// timers are overdue), so a loss it finds comes within it.
const settleAfterWake = 200 * time.Millisecond

// settle waits for the outcome of a pause of l's holder that ended at
// wokeAt. A renewal counts only if the database made it after wokeAt
// (its expiry is past wokeAt + TTL): one the ingest served during the
// pause was sent before it.
func (f *failover) settle(ctx context.Context, l lease, wokeAt time.Time) (takeover, lost bool, err error) {
	bound := 2*f.ttl + 10*time.Second
	for {
		now, err := f.lease(ctx)
		switch {
		case err != nil:
		case now.generation > l.generation:
			var holder string
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := f.pool.QueryRow(qctx, sqlGrantHolder, failoverPartition, l.generation+1).Scan(&holder)
			cancel()
			if err != nil {
				return false, true, fmt.Errorf("read the grant of generation %d: %w", l.generation+1, err)
			}
			return holder != l.holder, true, nil
		case now.expiresAt.After(wokeAt.Add(f.ttl)) && time.Since(wokeAt) >= settleAfterWake:
			return false, false, nil
		}
		if time.Since(wokeAt) > bound {
			return false, false, fmt.Errorf("the outcome of the pause was not settled within %v of SIGCONT (lease %+v, %v)", bound, now, err)
		}
		if !sleep(ctx, 10*time.Millisecond) {
			return false, false, ctx.Err()
		}
	}
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// summarize returns the nearest-rank p50, p90 and the maximum of xs.
func summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := slices.Sorted(slices.Values(xs))
	rank := func(p float64) float64 { return s[max(int(math.Ceil(p*float64(len(s))))-1, 0)] }
	return Summary{N: len(s), P50: rank(0.5), P90: rank(0.9), Max: s[len(s)-1]}
}

// maxDurations bounds a list ParseDurations accepts.
const maxDurations = 64

// ParseDurations reads a comma-separated list of durations ("500ms,1s,3s"),
// as the failover command's -ttls and -pauses take them. Blanks around an
// item are ignored; an empty item, an item time.ParseDuration refuses, or
// more than 64 items is an error.
func ParseDurations(s string) ([]time.Duration, error) {
	items := strings.Split(s, ",")
	if len(items) > maxDurations {
		return nil, fmt.Errorf("more than %d durations", maxDurations)
	}
	out := make([]time.Duration, 0, len(items))
	for i, item := range items {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("duration %d of %q is empty", i+1, s)
		}
		d, err := time.ParseDuration(item)
		if err != nil {
			return nil, fmt.Errorf("duration %d of the list: %w", i+1, err)
		}
		out = append(out, d)
	}
	return out, nil
}
