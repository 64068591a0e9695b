package benchreport

import (
	"time"

	"github.com/flowness/ledger/internal/lab/procstat"
)

// machineCPU is the CPU time the whole machine has spent working since
// boot (this process, PostgreSQL beside it, anything else); ok is false
// where there is none. Both pipelines are CPU-bound on a small machine, so
// CPU time per event drifts far less than their rates when the machine is
// shared.
func machineCPU() (time.Duration, bool) { return procstat.Machine() }

// cpuMeter measures the machine's CPU time over a stretch of work.
type cpuMeter struct {
	start time.Duration
	ok    bool
}

func startCPU() cpuMeter {
	c, ok := machineCPU()
	return cpuMeter{start: c, ok: ok}
}

// perEvent is the CPU time spent since the meter started, divided over n
// events; 0 when /proc/stat could not be read.
func (m cpuMeter) perEvent(n int) time.Duration {
	end, ok := machineCPU()
	if !m.ok || !ok || n < 1 || end < m.start {
		return 0
	}
	return (end - m.start) / time.Duration(n)
}
