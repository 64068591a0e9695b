package chaos

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseDurationsReadsTheCommandsLists(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []time.Duration
		err  string
	}{
		{"500ms,1s,3s,10s", FailoverTTLsDefault, ""},
		{" 100ms , 2s", []time.Duration{100 * time.Millisecond, 2 * time.Second}, ""},
		{"1m30s", []time.Duration{90 * time.Second}, ""},
		{"", nil, "duration 1 of \"\" is empty"},
		{"1s,,2s", nil, "duration 2 of \"1s,,2s\" is empty"},
		{"1s,", nil, "duration 2 of \"1s,\" is empty"},
		{"500", nil, "duration 1 of the list: time: missing unit in duration \"500\""},
		{"1s,fast", nil, "duration 2 of the list: time: invalid duration \"fast\""},
		{strings.Repeat("1s,", 64) + "1s", nil, "more than 64 durations"},
	} {
		got, err := ParseDurations(c.in)
		if c.err != "" {
			assert.EqualError(t, err, c.err, "%q", c.in)
			continue
		}
		require.NoError(t, err, "%q", c.in)
		assert.Equal(t, c.want, got, "%q", c.in)
	}
}

func TestFailoverOptionsRefuseWhatCannotRun(t *testing.T) {
	ok := FailoverOptions{}.WithDefaults()
	require.NoError(t, ok.Validate())
	for name, c := range map[string]struct {
		change func(*FailoverOptions)
		err    string
	}{
		"a TTL below the contract's":  {func(o *FailoverOptions) { o.TTLs = []time.Duration{50 * time.Millisecond} }, "a TTL must be whole milliseconds"},
		"a TTL of a fraction of a ms": {func(o *FailoverOptions) { o.TTLs = []time.Duration{1500 * time.Microsecond} }, "a TTL must be whole milliseconds"},
		"a negative pause":            {func(o *FailoverOptions) { o.Pauses = []time.Duration{-time.Second} }, "a pause must be in (0, 1m0s]"},
		"an hour's pause":             {func(o *FailoverOptions) { o.Pauses = []time.Duration{time.Hour} }, "a pause must be in (0, 1m0s]"},
		"no kill trials":              {func(o *FailoverOptions) { o.Trials = 0 }, "kill trials must be 1..1000, got 0"},
		"too many pause trials":       {func(o *FailoverOptions) { o.PauseTrials = 1001 }, "pause trials must be 1..1000, got 1001"},
		"a negative rate":             {func(o *FailoverOptions) { o.Rate = -1 }, "the rate must be positive"},
	} {
		o := ok
		c.change(&o)
		assert.ErrorContains(t, o.Validate(), c.err, name)
	}
}

func TestSummarizeTakesNearestRankPercentiles(t *testing.T) {
	assert.Equal(t, Summary{}, summarize(nil))
	assert.Equal(t, Summary{N: 1, P50: 7, P90: 7, Max: 7}, summarize([]float64{7}))
	xs := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	assert.Equal(t, Summary{N: 10, P50: 5, P90: 9, Max: 10}, summarize(xs))
	assert.Equal(t, 10.0, xs[0], "the caller's slice is left as it was")
}

func TestPrintFailoverShowsTheThreeTables(t *testing.T) {
	rep := &FailoverReport{Trials: 2, PauseTrials: 1, CPUs: 2, Seed: 7, Seconds: 9, TTLs: []TTLReport{{
		TTLMillis: 3000, Failover: Summary{N: 2, P50: 2510, P90: 2890, Max: 2890},
		Grant: Summary{N: 2, P50: 2490, P90: 2870, Max: 2870}, RenewalsPerSecond: 1,
		Pauses:  []PauseResult{{PauseMillis: 100, Trials: 1}, {PauseMillis: 2000, Trials: 1, Lost: 1}},
		Renewal: RenewalCost{N: 9000, RoundTripMicros: 110, CPUMicros: 40}, LoadBefore: 1.5, LoadAfter: -1,
	}}}
	var b bytes.Buffer
	require.NoError(t, PrintFailover(&b, rep))
	// Columns are aligned with spaces; the rows are compared by their words.
	out := strings.Join(strings.Fields(strings.ReplaceAll(b.String(), "\n", " | ")), " ")
	for _, want := range []string{
		"| 3s 2510ms 2890ms 2890ms 2490ms 0 1.5/? |",
		"| TTL 100ms 2s |",
		"| 3s 0/1 0/1 +1 |",
		"| 3s 1.00 110µs 40µs 0.04 |",
	} {
		assert.Contains(t, out, want, b.String())
	}
}

// FuzzParseDurations: any list is read without a panic, and what it reads
// reads back the same from its own formatting.
func FuzzParseDurations(f *testing.F) {
	for _, s := range []string{"500ms,1s,3s,10s", "100ms,250ms,500ms,1s,2s", " 1s ,2s", "", ",", "1s,,2s", "500", "-1s",
		"9223372036854775807ns", "1h1m1s1ms1us1ns", strings.Repeat("1s,", 70)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ds, err := ParseDurations(s)
		if err != nil {
			if ds != nil {
				t.Fatalf("%q: durations %v with error %v", s, ds, err)
			}
			return
		}
		if len(ds) == 0 || len(ds) > maxDurations {
			t.Fatalf("%q: %d durations", s, len(ds))
		}
		parts := make([]string, len(ds))
		for i, d := range ds {
			parts[i] = d.String()
		}
		again, err := ParseDurations(strings.Join(parts, ","))
		if err != nil || !slicesEqual(again, ds) {
			t.Fatalf("%q read %v, which reads back as %v (%v)", s, ds, again, err)
		}
	})
}

func slicesEqual(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
