//go:build ledger_noguards

package ingest

import (
	"fmt"
	"os"
)

// A binary built with -tags ledger_noguards checks nothing against a
// database that forgot (no memory check, no generation witness): the
// chaos run's failover negative control. Only the build tag reaches it.
func init() {
	buildUnguarded = true
	fmt.Fprintln(os.Stderr, "ingest: built with -tags ledger_noguards: THE MEMORY CHECK AND THE WITNESS ARE OFF (chaos negative control only)")
}
