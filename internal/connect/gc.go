package connect

import (
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// GCPercentDefault is the garbage collector's target (GOGC) the services
// run with when the environment sets none. At Go's own 100 the collector
// took a fifth of the ingest's CPU; at 400 the ingest's CPU per event fell
// from 17 to 13 µs and the projector's from 12 to 11, for a resident set
// about twice as large (122 MiB against 57 for the ingest at saturation):
// docs/operations.md, "Memory and the garbage collector".
const GCPercentDefault = 400

// memoryLimitShare is the share of a container's memory limit given to the
// Go runtime as its soft limit (GOMEMLIMIT) when the environment sets none:
// the rest is for what the runtime does not count (stacks, the binary, the
// kernel's buffers), so the larger GOGC never runs the process out of its
// container.
const memoryLimitShare = 0.9

// Cgroup files holding the container's memory limit: cgroup v2, then v1.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// gcSettings is what TuneGC sets: a GC percent (0: leave it) and a memory
// limit in bytes (0: leave it).
type gcSettings struct {
	percent int
	limit   int64
}

// gcDefaults decides the services' GC settings from the environment
// (getenv) and the container's memory limit (cgroup: the contents of the
// first cgroup file that exists, "" if none). GOGC or GOMEMLIMIT set in
// the environment, whatever their value, are the runtime's to apply, and
// are left alone.
func gcDefaults(getenv func(string) string, cgroup string) gcSettings {
	var s gcSettings
	if getenv("GOGC") == "" {
		s.percent = GCPercentDefault
	}
	if getenv("GOMEMLIMIT") == "" {
		// "max" (v2) or a figure near 2^63 (v1) is no limit.
		if n, err := strconv.ParseInt(strings.TrimSpace(cgroup), 10, 64); err == nil && n > 0 && n < 1<<50 {
			s.limit = int64(float64(n) * memoryLimitShare)
		}
	}
	return s
}

// TuneGC gives the process the services' GC defaults (GCPercentDefault,
// and a soft memory limit of 90% of its container's) where the environment
// does not set GOGC or GOMEMLIMIT, and logs what it set.
func TuneGC(log *slog.Logger) {
	var cgroup string
	for _, f := range cgroupMemoryFiles {
		if b, err := os.ReadFile(f); err == nil {
			cgroup = string(b)
			break
		}
	}
	s := gcDefaults(os.Getenv, cgroup)
	if s.percent > 0 {
		debug.SetGCPercent(s.percent)
	}
	if s.limit > 0 {
		debug.SetMemoryLimit(s.limit)
	}
	if log != nil && (s.percent > 0 || s.limit > 0) {
		log.Info("garbage collector tuned (GOGC and GOMEMLIMIT override)",
			slog.Int("gc_percent", s.percent), slog.Int64("memory_limit_bytes", s.limit))
	}
}
