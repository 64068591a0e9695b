package benchreport

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// userHZ is the unit of /proc/stat's times: 100 ticks a second on every
// Linux the ledger runs on (sysconf(_SC_CLK_TCK)).
const userHZ = 100

// machineCPU is the CPU time the whole machine has spent working since
// boot (this process, PostgreSQL beside it, anything else), read from
// /proc/stat; ok is false where there is none. Both pipelines are CPU-bound
// on a small machine, so CPU time per event drifts far less than their
// rates when the machine is shared.
func machineCPU() (time.Duration, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	return parseProcStat(data)
}

// parseProcStat reads the busy time of the first line of /proc/stat,
// "cpu  user nice system idle iowait irq softirq steal guest guest_nice":
// user, nice, system, irq and softirq. Idle and iowait are not work; steal
// is time the hypervisor gave to another machine, which would make a
// contended host look like a costlier pipeline; guest and guest_nice are
// already counted in user and nice. Lines with fewer fields (old kernels)
// count what they have.
func parseProcStat(data []byte) (time.Duration, bool) {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := bytes.Fields(line)
	if len(fields) < 5 || string(fields[0]) != "cpu" {
		return 0, false
	}
	var ticks uint64
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(string(f), 10, 64)
		if err != nil {
			return 0, false
		}
		switch i {
		case 0, 1, 2, 5, 6: // user, nice, system, irq, softirq
			if ticks+v < ticks {
				return 0, false
			}
			ticks += v
		}
	}
	const maxTicks = uint64(1<<63-1) / uint64(time.Second/userHZ)
	if ticks > maxTicks {
		return 0, false
	}
	return time.Duration(ticks) * (time.Second / userHZ), true
}

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
