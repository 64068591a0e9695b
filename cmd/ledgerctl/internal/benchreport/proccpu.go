package benchreport

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// procStat is what a /proc/<pid>/stat line tells of a process's CPU time.
type procStat struct {
	ppid int
	// own is utime+stime: the process's own CPU time; reaped is
	// cutime+cstime: that of its children (and their descendants) it
	// has waited for, which left the process tree when they exited.
	own, reaped time.Duration
}

// errProcStat is wrapped by parsePIDStat's errors.
var errProcStat = errors.New("not a /proc/<pid>/stat line")

// parsePIDStat reads a /proc/<pid>/stat line (proc(5)): ppid (field 4),
// utime, stime, cutime and cstime (fields 14 to 17), in clock ticks.
// Field 2, the command in parentheses, may itself hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parsePIDStat(b []byte) (procStat, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 || bytes.IndexByte(b[:end], '(') < 0 {
		return procStat{}, fmt.Errorf("%w: no command in parentheses", errProcStat)
	}
	fields := bytes.Fields(b[end+1:])
	// fields[0] is field 3 (state), so field n is fields[n-3].
	if len(fields) < 17-3+1 {
		return procStat{}, fmt.Errorf("%w: %d fields after the command", errProcStat, len(fields))
	}
	ppid, err := strconv.ParseUint(string(fields[4-3]), 10, 31)
	if err != nil {
		return procStat{}, fmt.Errorf("%w: ppid %q: %w", errProcStat, fields[4-3], err)
	}
	var ticks [4]uint64
	for i, f := range fields[14-3 : 17-3+1] {
		// cutime and cstime are signed in the kernel's format; a negative
		// one is no CPU time, and is refused like any other nonsense.
		if ticks[i], err = strconv.ParseUint(string(f), 10, 62); err != nil {
			return procStat{}, fmt.Errorf("%w: CPU time %q: %w", errProcStat, f, err)
		}
	}
	// Each below 2^62, so the sums do not overflow; their durations may.
	own, reaped := ticks[0]+ticks[1], ticks[2]+ticks[3]
	const maxTicks = uint64(1<<63-1) / uint64(time.Second/userHZ)
	if own > maxTicks || reaped > maxTicks || own+reaped > maxTicks {
		return procStat{}, fmt.Errorf("%w: CPU time of %d ticks overflows", errProcStat, own+reaped)
	}
	return procStat{ppid: int(ppid), own: ticksToDuration(own), reaped: ticksToDuration(reaped)}, nil
}

func ticksToDuration(ticks uint64) time.Duration {
	return time.Duration(ticks) * (time.Second / userHZ)
}

// procSnapshot is every process's stat at one moment, by pid.
type procSnapshot map[int]procStat

// readProcSnapshot reads the stat of every process in /proc. A process
// that exits while it is read is left out: its CPU time moves to its
// parent's reaped time once the parent waits for it.
func readProcSnapshot() (procSnapshot, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	snap := procSnapshot{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if st, err := parsePIDStat(b); err == nil {
			snap[pid] = st
		}
	}
	return snap, nil
}

// treeCPU is the CPU time of root and every descendant, live or reaped:
// each live process's own time plus the time of the children it reaped.
// Over a window, its growth is what the tree spent in that window, even
// when a child (a PostgreSQL backend, say) exits meanwhile: its time then
// moves from its own to its parent's reaped. n counts the live processes.
func (s procSnapshot) treeCPU(root int) (cpu time.Duration, n int, err error) {
	if _, ok := s[root]; !ok {
		return 0, 0, fmt.Errorf("process %d is not running", root)
	}
	children := map[int][]int{}
	for pid, st := range s {
		children[st.ppid] = append(children[st.ppid], pid)
	}
	// Read one pid at a time, the parent links need not form a tree: a pid
	// reused while they were read could close a loop.
	seen := map[int]bool{}
	todo := []int{root}
	for len(todo) > 0 {
		pid := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		st := s[pid]
		cpu += st.own + st.reaped
		n++
		todo = append(todo, children[pid]...)
	}
	return cpu, n, nil
}

// parentOf is pid's parent, as the snapshot saw it.
func (s procSnapshot) parentOf(pid int) (int, error) {
	st, ok := s[pid]
	if !ok {
		return 0, fmt.Errorf("process %d is not running", pid)
	}
	return st.ppid, nil
}
