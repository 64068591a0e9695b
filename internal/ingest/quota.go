package ingest

import (
	"strings"

	"github.com/flowness/ledger/pkg/wire"
)

// principalOfSubject is the principal a LEDGER_IN subject names (its third
// token: <prefix>.in.<principal>.…), or "-".
func principalOfSubject(subject string) string {
	parts := strings.SplitN(subject, ".", 4)
	if len(parts) < 4 || !wire.ValidID(parts[2]) {
		return "-"
	}
	return parts[2]
}
