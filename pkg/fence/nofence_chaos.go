//go:build ledger_nofence

package fence

import (
	"fmt"
	"os"
)

// A binary built with -tags ledger_nofence has every Store unfenced: no lease
// lock, no stale verdict, no fence predicate in the insert (the seam the
// commit-order race test uses). It exists so that the chaos run's negative
// control (internal/lab/chaos) can prove its checker sees the stale commits the
// fence prevents. No flag or setting reaches it; only the build tag does.
func init() {
	buildUnfenced = true
	fmt.Fprintln(os.Stderr, "fence: built with -tags ledger_nofence: THE FENCE IS OFF (chaos negative control only)")
}
