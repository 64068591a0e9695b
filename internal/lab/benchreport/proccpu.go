package benchreport

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/flowness/ledger/internal/lab/procstat"
)

// procSnapshot is every process's stat at one moment, by pid.
type procSnapshot map[int]procstat.Process

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
		if st, err := procstat.ParseProcess(b); err == nil {
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
		children[st.PPID] = append(children[st.PPID], pid)
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
		cpu += st.Own + st.Reaped
		n++
		todo = append(todo, children[pid]...)
	}
	return cpu, n, nil
}
