//go:build ledger_noguards

package fence

import (
	"fmt"
	"os"
)

// A binary built with -tags ledger_noguards has every PrimaryGuard off: it
// refuses no superseded primary. It exists so that the chaos run's
// failover negative control (internal/lab/chaos) can prove its
// checker sees what the guards prevent. No flag or setting reaches it;
// only the build tag does.
func init() {
	buildUnguarded = true
	fmt.Fprintln(os.Stderr, "fence: built with -tags ledger_noguards: THE PRIMARY GUARD IS OFF (chaos negative control only)")
}
