// Package procstat reads CPU time from Linux's /proc: a process's own
// (/proc/<pid>/stat) and the whole machine's (/proc/stat), and the
// machine's load average (/proc/loadavg). The benchmark report and the
// failover measurement both count CPU time per event with it.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// UserHZ is the unit of /proc's CPU times, clock ticks: 100 a second on
// every Linux architecture Go supports (sysconf(_SC_CLK_TCK)).
const UserHZ = 100

// maxTicks is the most ticks a time.Duration holds.
const maxTicks = uint64(1<<63-1) / uint64(time.Second/UserHZ)

func ticks(n uint64) time.Duration { return time.Duration(n) * (time.Second / UserHZ) }

// Process is what a /proc/<pid>/stat line tells of a process's CPU time.
type Process struct {
	PPID int
	// Own is utime+stime: the process's own CPU time. Reaped is
	// cutime+cstime: that of its children (and their descendants) it has
	// waited for, which left the process tree when they exited.
	Own, Reaped time.Duration
}

// ErrNotStat is wrapped by ParseProcess's errors.
var ErrNotStat = errors.New("not a /proc/<pid>/stat line")

// ParseProcess reads a /proc/<pid>/stat line (proc(5)): ppid (field 4),
// utime, stime, cutime and cstime (fields 14 to 17), in clock ticks.
// Field 2, the command in parentheses, may itself hold spaces and
// parentheses, so the fields are counted from the last ')'.
func ParseProcess(b []byte) (Process, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 || bytes.IndexByte(b[:end], '(') < 0 {
		return Process{}, fmt.Errorf("%w: no command in parentheses", ErrNotStat)
	}
	fields := bytes.Fields(b[end+1:])
	// fields[0] is field 3 (state), so field n is fields[n-3].
	if len(fields) < 17-3+1 {
		return Process{}, fmt.Errorf("%w: %d fields after the command", ErrNotStat, len(fields))
	}
	ppid, err := strconv.ParseUint(string(fields[4-3]), 10, 31)
	if err != nil {
		return Process{}, fmt.Errorf("%w: ppid %q: %w", ErrNotStat, fields[4-3], err)
	}
	var t [4]uint64
	for i, f := range fields[14-3 : 17-3+1] {
		// cutime and cstime are signed in the kernel's format; a negative
		// one is no CPU time, and is refused like any other nonsense.
		if t[i], err = strconv.ParseUint(string(f), 10, 62); err != nil {
			return Process{}, fmt.Errorf("%w: CPU time %q: %w", ErrNotStat, f, err)
		}
	}
	// Each below 2^62, so the sums do not overflow; their durations may.
	own, reaped := t[0]+t[1], t[2]+t[3]
	if own > maxTicks || reaped > maxTicks || own+reaped > maxTicks {
		return Process{}, fmt.Errorf("%w: CPU time of %d ticks overflows", ErrNotStat, own+reaped)
	}
	return Process{PPID: int(ppid), Own: ticks(own), Reaped: ticks(reaped)}, nil
}

// ReadProcess reads process pid's stat.
func ReadProcess(pid int) (Process, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Process{}, fmt.Errorf("read the CPU time of process %d: %w", pid, err)
	}
	return ParseProcess(b)
}

// Machine is the CPU time the whole machine has spent working since boot,
// read from /proc/stat; ok is false where there is none.
func Machine() (time.Duration, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	return ParseMachine(data)
}

// ParseMachine reads the busy time of the first line of /proc/stat,
// "cpu  user nice system idle iowait irq softirq steal guest guest_nice":
// user, nice, system, irq and softirq. Idle and iowait are not work; steal
// is time the hypervisor gave to another machine, which would make a
// contended host look like a costlier workload; guest and guest_nice are
// already counted in user and nice. Lines with fewer fields (old kernels)
// count what they have.
func ParseMachine(data []byte) (time.Duration, bool) {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := bytes.Fields(line)
	if len(fields) < 5 || string(fields[0]) != "cpu" {
		return 0, false
	}
	var sum uint64
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(string(f), 10, 64)
		if err != nil {
			return 0, false
		}
		switch i {
		case 0, 1, 2, 5, 6: // user, nice, system, irq, softirq
			if sum+v < sum {
				return 0, false
			}
			sum += v
		}
	}
	if sum > maxTicks {
		return 0, false
	}
	return ticks(sum), true
}

// LoadAverage is the machine's 1-minute load average, from /proc/loadavg;
// -1 when unknown.
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	l, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return l
}
