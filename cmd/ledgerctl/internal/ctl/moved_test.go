package ctl_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// An operator's script that still runs "ledgerctl chaos" or "ledgerctl
// bench" learns the command to run instead. Switch: drop the two entries
// of movedToLab from the commands; they fail as unknown commands, exit 2.
func TestLabCommandsSayWhereTheyWent(t *testing.T) {
	t.Parallel()
	r := run(t, "chaos", "-external", "-duration", "1m")
	require.Equal(t, 1, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stderr, "run 'ledgerlab chaos -external -duration 1m'")
	require.Contains(t, r.stderr, "go run ./cmd/ledgerlab chaos -external -duration 1m")

	r = run(t, "bench", "-external")
	require.Equal(t, 1, r.code, "stderr: %s", r.stderr)
	require.Contains(t, r.stderr, "run 'ledgerlab bench -external'")
}
