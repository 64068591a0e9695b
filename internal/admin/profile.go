package admin

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// StartCPUProfile profiles the process into the file at path until stop is
// called: the ingest's and ledgerlab bench's -cpuprofile.
func StartCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}
