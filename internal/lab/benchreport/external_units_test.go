package benchreport

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTreeCPUCountsAChildThatExitedInTheWindowOnce(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	// The postmaster (7) with a backend (8) that has its own child (9),
	// and an unrelated process (5).
	before := procSnapshot{
		5: {PPID: 1, Own: 900 * ms},
		7: {PPID: 1, Own: 10 * ms, Reaped: 100 * ms},
		8: {PPID: 7, Own: 40 * ms},
		9: {PPID: 8, Own: 20 * ms},
	}
	// In the window 9 spent 10 ms more and exited (8 reaped it), 8 spent
	// 30 ms more and exited (7 reaped it), and a new backend 10 spent 5 ms.
	after := procSnapshot{
		5:  {PPID: 1, Own: 1900 * ms},
		7:  {PPID: 1, Own: 10 * ms, Reaped: 100*ms + (40+30)*ms + (20+10)*ms},
		10: {PPID: 7, Own: 5 * ms},
	}
	t0, n0, err := before.treeCPU(7)
	require.NoError(t, err)
	t1, n1, err := after.treeCPU(7)
	require.NoError(t, err)
	require.Equal(t, 3, n0)
	require.Equal(t, 2, n1)
	require.Equal(t, (10+30+5)*ms, t1-t0, "what the tree spent in the window, the exited processes' share included")

	_, _, err = after.treeCPU(8)
	require.Error(t, err, "an exited root is no measurement")
}

func TestTreeCPUEndsOnALoopOfParents(t *testing.T) {
	t.Parallel()
	s := procSnapshot{3: {PPID: 4, Own: time.Second}, 4: {PPID: 3, Own: time.Second}}
	cpu, n, err := s.treeCPU(3)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 2*time.Second, cpu)
}

func TestCostsAreEachComponentsCPUOverTheEvents(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	before := procSnapshot{10: {PPID: 1, Own: 100 * ms}, 20: {PPID: 1, Own: 0}, 21: {PPID: 1, Own: 50 * ms}}
	after := procSnapshot{10: {PPID: 1, Own: 600 * ms}, 20: {PPID: 1, Own: 200 * ms}, 21: {PPID: 1, Own: 250 * ms}}
	cs, err := costs(before, after, []component{{name: ComponentIngest, pids: []int{10}},
		{name: ComponentWorkers, pids: []int{20, 21}}}, 10_000)
	require.NoError(t, err)
	require.Equal(t, []Component{
		{Name: ComponentIngest, Processes: 1, CPU: 500 * ms, PerEvent: 50 * time.Microsecond, PerCore: 20_000},
		{Name: ComponentWorkers, Processes: 2, CPU: 400 * ms, PerEvent: 40 * time.Microsecond, PerCore: 25_000},
	}, cs)
	all := total(cs, 10_000)
	require.Equal(t, Component{Name: "all", Processes: 3, CPU: 900 * ms, PerEvent: 90 * time.Microsecond,
		PerCore: 10_000 / 0.9}, all)

	_, err = costs(after, before, []component{{name: ComponentIngest, pids: []int{10}}}, 1)
	require.ErrorContains(t, err, "went back", "a restarted process is no measurement")
}

func TestWorkersShareEveryEventOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ events, workers int }{{50_000, 4}, {1_000, 3}, {17, 16}, {2_000, 1}} {
		seen := map[string]int{}
		sum := 0
		for w := range c.workers {
			o := WorkerOptions{Run: "r", Worker: w, Workers: c.workers, Events: c.events}
			share, counts := o.share()
			require.Len(t, counts, len(share.tasks))
			for i, task := range share.tasks {
				require.Equal(t, w, share.parts[i]%c.workers, "worker %d holds partition %d", w, share.parts[i])
				require.Equal(t, i, share.index[task])
				seen[task]++
				sum += counts[i]
			}
		}
		require.Equal(t, c.events, sum, "%+v: every event published once", c)
		require.Len(t, seen, taskCount(c.events), "%+v: every task has its worker", c)
		for task, n := range seen {
			require.Equal(t, 1, n, "%+v: task %s has one worker", c, task)
		}
	}
}

func TestWorkerLinesDecode(t *testing.T) {
	t.Parallel()
	good := map[string]workerLine{
		`{"state":"ready"}`: {State: workerReady},
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20}`: {State: workerDone, Events: 3,
			FirstPublish: 10, LastReceipt: 20},
		`{"state":"done"}`: {State: workerDone},
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"in_first_window":3}`: {State: workerDone,
			Events: 3, FirstPublish: 10, LastReceipt: 20, InFirstWindow: 3},
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"latency":[[5,2],[700,1]]}`: {
			State: workerDone, Events: 3, FirstPublish: 10, LastReceipt: 20, Latency: [][]int64{{5, 2}, {700, 1}}},
	}
	for line, want := range good {
		got, err := decodeWorkerLine([]byte(line))
		require.NoError(t, err, line)
		require.Equal(t, want, got, line)
	}
	for _, line := range []string{
		``, `{`, `[]`, `{"state":"gone"}`, `{"state":"ready","events":1}`, `{"state":"ready","pid":1}`,
		`{"state":"done","events":-1}`, `{"state":"done","events":3,"first_publish_ns":20,"last_receipt_ns":10}`,
		`{"state":"done","events":3}`, `{"state":"done","first_publish_ns":1,"last_receipt_ns":2}`,
		`{"state":"ready"} {"state":"ready"}`, `{"state":"done","events":1e400}`, `{"state":"ready"}}`, `{"state":"ready"}]`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"in_first_window":4}`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"in_first_window":-1}`,
		`{"state":"ready","in_first_window":1}`,
		`{"state":"ready","latency":[[1,1]]}`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"latency":[[5,2]]}`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"latency":[[5,2],[5,1]]}`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"latency":[[7,2],[5,1]]}`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"latency":[[-1,2],[5,1]]}`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"latency":[[5,3],[1622,0]]}`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"latency":[[5,2],[1622,1]]}`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"latency":[[5,2,1],[6,1]]}`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"latency":[[5],[6,3]]}`,
	} {
		_, err := decodeWorkerLine([]byte(line))
		require.Error(t, err, line)
	}
}

func FuzzDecodeWorkerLine(f *testing.F) {
	for _, s := range []string{`{"state":"ready"}`, `{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20}`,
		`{"state":"done","events":3,"first_publish_ns":10,"last_receipt_ns":20,"latency":[[5,2],[700,1]]}`,
		`{"state":"done","events":3,"first_publish_ns":20,"last_receipt_ns":10}`, `{"state":"ready","events":1}`, `{`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := decodeWorkerLine(b)
		if err != nil {
			return
		}
		require.Contains(t, []string{workerReady, workerDone}, l.State)
		require.GreaterOrEqual(t, l.Events, 0)
		require.GreaterOrEqual(t, l.InFirstWindow, 0)
		require.LessOrEqual(t, l.InFirstWindow, l.Events)
		if l.Events > 0 {
			require.Positive(t, l.FirstPublish)
			require.GreaterOrEqual(t, l.LastReceipt, l.FirstPublish)
		}
		if l.Latency != nil {
			require.Equal(t, workerDone, l.State)
			lat := latencies{}
			lat.merge(l.Latency) // in range: no panic, and every event counted once
			require.Equal(t, int64(l.Events), lat.count())
		}
	})
}

func TestWorkerOptionsRefuseWhatCannotRun(t *testing.T) {
	t.Parallel()
	ok := WorkerOptions{NATSURL: "nats://127.0.0.1:4222", Run: "abc", Worker: 1, Workers: 2, Events: 10}
	require.NoError(t, ok.validate())
	for name, mod := range map[string]func(*WorkerOptions){
		"no url":                  func(o *WorkerOptions) { o.NATSURL = "" },
		"a run id with dots":      func(o *WorkerOptions) { o.Run = "a.b" },
		"worker beyond":           func(o *WorkerOptions) { o.Worker = 2 },
		"too many workers":        func(o *WorkerOptions) { o.Workers, o.Worker = 17, 0 },
		"no events":               func(o *WorkerOptions) { o.Events = 0 },
		"a negative rate":         func(o *WorkerOptions) { o.Rate = -1 },
		"bare at full speed":      func(o *WorkerOptions) { o.Bare, o.DatabaseURL = true, "postgres://x@127.0.0.1/y" },
		"bare without a database": func(o *WorkerOptions) { o.Bare, o.Rate = true, 100 },
		"bare and raw": func(o *WorkerOptions) {
			o.Bare, o.Raw, o.Rate, o.DatabaseURL = true, true, 100, "postgres://x@127.0.0.1/y"
		},
	} {
		o := ok
		mod(&o)
		require.Error(t, o.validate(), name)
	}
}

// A worker counts the receipts that arrive within FirstWindow of its first
// publish; the last receipt counts for the run's end either way.
func TestNoteTimesCountsTheReceiptsOfTheFirstWindow(t *testing.T) {
	t.Parallel()
	var n noteTimes
	t0 := time.Unix(100, 0)
	n.published(t0)
	n.published(t0.Add(time.Millisecond)) // a later publish does not move the start
	require.True(t, n.inWindow(t0.Add(FirstWindow-time.Nanosecond)))
	require.False(t, n.inWindow(t0.Add(FirstWindow)))
	n.received(t0.Add(300 * time.Millisecond))
	n.receivedEarly(t0.Add(900 * time.Millisecond))
	n.received(t0.Add(FirstWindow))
	n.receivedLast(t0.Add(3 * time.Second))
	n.receivedEarly(t0.Add(2 * time.Second))
	require.Equal(t, runTimes{first: t0.UnixNano(), last: t0.Add(3 * time.Second).UnixNano(), inFirst: 2}, n.times())
}

func TestSplitAtWindowComparesTheFirstSecondWithTheRest(t *testing.T) {
	t.Parallel()
	first, rest := splitAtWindow(5_000, 45_000, 5*time.Second)
	require.Equal(t, 5_000, first.Events)
	require.InDelta(t, 5_000, first.PerSecond, 1e-9)
	require.Equal(t, 40_000, rest.Events)
	require.InDelta(t, 10_000, rest.PerSecond, 1e-9)
	require.InDelta(t, 0.5, first.Relative, 1e-9)
	require.Equal(t, "the rest", first.RelativeTo)

	first, rest = splitAtWindow(5_000, 5_000, 2*FirstWindow-time.Nanosecond)
	require.Zero(t, first, "a run shorter than two windows is not split")
	require.Zero(t, rest)
}

func TestComparisonTakesTheMediansOfItsRounds(t *testing.T) {
	t.Parallel()
	report := func(raw bool, perSecond, first float64) ExternalReport {
		return ExternalReport{Raw: raw, Receipt: Row{Label: "r", PerSecond: perSecond},
			FirstWindow: Row{Label: "first second", PerSecond: 1, Relative: first}}
	}
	c := Comparison{Rounds: []ComparisonRound{
		{SDK: report(false, 18_000, 0.8), Raw: report(true, 20_000, 0.5)},
		{SDK: report(false, 21_000, 0.9), Raw: report(true, 20_000, 0.7)},
		{SDK: report(false, 19_000, 0), Raw: report(true, 20_000, 0)}, // too short to split
	}}
	c.summarize()
	require.InDelta(t, 0.95, c.Ratio, 1e-9)
	require.InDelta(t, 0.85, c.SDKFirst, 1e-9)
	require.InDelta(t, 0.6, c.RawFirst, 1e-9)
	table := c.Table()
	require.Contains(t, table, "SDK / raw, median of 3 rounds: 0.95; first second / the rest, medians: SDK 0.85, raw 0.60")
	require.Contains(t, table, "\n3        raw     20,000")
}

// A latency falls in the bucket whose upper bound is at most 1% above it,
// and a percentile of merged histograms is over every event of them.
func TestHistogramPercentilesAreWithinOnePercent(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{time.Nanosecond, histLowest, 11 * time.Microsecond, 3 * time.Millisecond,
		47*time.Millisecond + 123*time.Microsecond, 99 * time.Second} {
		top := bucketTop(bucketOf(d))
		require.GreaterOrEqual(t, top, d, "%v", d)
		if d > histLowest {
			require.LessOrEqual(t, float64(top), float64(d)*histGrowth*1.000001, "%v counts in a bucket up to %v", d, top)
		}
	}
	require.Equal(t, histBuckets-1, bucketOf(time.Hour), "beyond 100 s: the last bucket")

	// Two workers: one saw 100 events at 1 ms, the other 98 at 2 ms and 2
	// at 100 ms. Of the 200, the 100th is at 1 ms and the 198th at 2 ms;
	// the slowest 2 are beyond p99.
	var a, b histogram
	for range 100 {
		a.add(time.Millisecond)
	}
	for range 98 {
		b.add(2 * time.Millisecond)
	}
	b.add(100 * time.Millisecond)
	b.add(100 * time.Millisecond)
	require.NoError(t, checkBuckets(a.buckets(), 100))
	all := latencies{}
	all.merge(a.buckets())
	all.merge(b.buckets())
	require.Equal(t, int64(200), all.count())
	within := func(want, got time.Duration) {
		t.Helper()
		require.GreaterOrEqual(t, got, want)
		require.LessOrEqual(t, float64(got), float64(want)*histGrowth)
	}
	within(time.Millisecond, all.percentile(50))
	within(2*time.Millisecond, all.percentile(99))
	within(100*time.Millisecond, all.percentile(100))
	require.Zero(t, latencies{}.percentile(99))
	row := histogramRow("x", all, time.Second)
	require.Equal(t, 200, row.Events)
	require.True(t, row.Latency)
	require.Equal(t, all.percentile(99), row.P99)
}
