package ctl

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// The reasons dlq replay gives quote what they were given: they are
// escaped like the tables (internal/cli tests the error a command fails with).
func TestReplayDetailsAreEscaped(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := replaySummary(&out, []replayResult{
		{StreamSeq: 1, Result: replayUnusable, Detail: "holder \x1b]0;owned\x07"},
		{StreamSeq: 2, Result: replayFailed, Detail: "fake\rreal"},
		{StreamSeq: 3, Result: replayNotFound, Detail: "\u202eevil"},
	}, 0)
	require.Error(t, err)
	require.Equal(t, "seq 3: not found: \\u202eevil\nseq 1: holder \\x1b]0;owned\\a\nseq 2: failed: fake\\rreal\n", out.String())
}
