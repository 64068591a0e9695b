package procstat

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// statLine is a /proc/<pid>/stat line of process pid with the given parent
// and CPU times in ticks.
func statLine(pid, ppid int, comm string, utime, stime, cutime, cstime int64) string {
	return fmt.Sprintf("%d (%s) S %d 100 100 0 -1 4194560 1300 0 0 0 %d %d %d %d 20 0 12 0 2200 1234567 890 "+
		"18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n", pid, comm, ppid, utime, stime, cutime, cstime)
}

func TestProcessReadsParentAndCPUTimes(t *testing.T) {
	t.Parallel()
	tick := time.Second / UserHZ
	cases := []struct {
		name string
		line string
		want Process
	}{
		{"a service", statLine(42, 1, "ingest", 300, 45, 0, 0), Process{PPID: 1, Own: 345 * tick}},
		{"a postmaster with reaped backends", statLine(7, 1, "postgres", 10, 5, 120, 30),
			Process{PPID: 1, Own: 15 * tick, Reaped: 150 * tick}},
		{"a command with spaces and parentheses", statLine(9, 7, "postgres: ) idle (x", 1, 2, 3, 4),
			Process{PPID: 7, Own: 3 * tick, Reaped: 7 * tick}},
	}
	for _, c := range cases {
		got, err := ParseProcess([]byte(c.line))
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, got, c.name)
	}
}

func TestProcessRefusesWhatIsNotAStatLine(t *testing.T) {
	t.Parallel()
	for name, line := range map[string]string{
		"empty":               "",
		"no command":          "42 S 1 100",
		"too few fields":      "42 (x) S 1 100 100 0 -1 4194560 1300 0 0 0 3 4 5",
		"a negative utime":    statLine(42, 1, "x", -5, 1, 0, 0),
		"a negative cutime":   statLine(42, 1, "x", 1, 1, -5, 0),
		"a letter for utime":  "42 (x) S 1 100 100 0 -1 4194560 1300 0 0 0 3a 4 5 6 20",
		"a tick count beyond": statLine(42, 1, "x", 1<<61, 1<<61, 0, 0),
		"a parent beyond":     "42 (x) S 99999999999 100 100 0 -1 4194560 1300 0 0 0 3 4 5 6 20",
	} {
		_, err := ParseProcess([]byte(line))
		require.ErrorIs(t, err, ErrNotStat, name)
	}
}

func TestReadProcessReadsThisProcess(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here:", err)
	}
	p, err := ReadProcess(os.Getpid())
	require.NoError(t, err)
	require.Equal(t, os.Getppid(), p.PPID)
}

func TestLoadAverageReadsThisMachines(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/loadavg"); err != nil {
		t.Skip("no /proc here:", err)
	}
	require.GreaterOrEqual(t, LoadAverage(), 0.0)
}

func FuzzParseProcess(f *testing.F) {
	f.Add([]byte(statLine(42, 1, "ingest", 300, 45, 0, 0)))
	f.Add([]byte(statLine(9, 7, "postgres: ) idle (x", 1, 2, 3, 4)))
	f.Add([]byte(statLine(42, 1, "x", 1, 1, -5, 0)))
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 0 0 0 0 9223372036854775807 9223372036854775807 0 0"))
	f.Add([]byte("42 (x) S 1 100 100 0 -1 4194560 1300 0 0 0 3 4 5"))
	f.Add([]byte(""))
	f.Add([]byte(")("))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseProcess(b)
		if err != nil {
			require.ErrorIs(t, err, ErrNotStat)
			return
		}
		require.GreaterOrEqual(t, p.PPID, 0)
		require.GreaterOrEqual(t, p.Own, time.Duration(0))
		require.GreaterOrEqual(t, p.Reaped, time.Duration(0))
		require.GreaterOrEqual(t, p.Own+p.Reaped, p.Own, "the sum does not overflow")
	})
}

func TestMachineBusyTime(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		in   string
		want time.Duration
		ok   bool
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"every field", "cpu  300 20 100 5000 40 3 7 900 11 13\ncpu0 1 2 3 4\n", 430 * 10 * time.Millisecond, true},
		{"old kernel, four fields", "cpu 1 2 3 4 5\n", 6 * 10 * time.Millisecond, true},
		{"not the cpu line", "cpu0 1 2 3 4 5\n", 0, false},
		{"too short", "cpu 1 2 3\n", 0, false},
		{"not a number", "cpu 1 x 3 4 5\n", 0, false},
		{"negative", "cpu -1 2 3 4 5\n", 0, false},
		{"overflow", "cpu 18446744073709551615 1 0 0 0\n", 0, false},
		{"empty", "", 0, false},
	} {
		got, ok := ParseMachine([]byte(c.in))
		require.Equal(t, c.ok, ok, c.name)
		require.Equal(t, c.want, got, c.name)
	}
}

func FuzzParseMachine(f *testing.F) {
	for _, seed := range []string{
		"cpu  323937 0 148649 216939 3869 0 6134 335 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n",
		"cpu 1 2 3 4 5\n", "cpu0 1 2 3 4 5\n", "cpu 1 x 3 4 5\n", "cpu 18446744073709551615 1 0 0 0\n",
		"cpu 922337203685477580 1 1 1 1\n", "", "\n", "cpu",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, ok := ParseMachine(data)
		if !ok && d != 0 {
			t.Fatalf("not ok but %v", d)
		}
		if d < 0 {
			t.Fatalf("negative CPU time %v", d)
		}
	})
}
