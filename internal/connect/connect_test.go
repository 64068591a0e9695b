package connect

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A malformed environment value is an error from Parse, never silently the
// default, and the process is not exited under the caller.
func TestMalformedEnvironmentIsAnErrorFromParse(t *testing.T) {
	t.Setenv("LEDGER_TEST_INT", "forty")
	t.Setenv("LEDGER_TEST_DURATION", "soon")
	require.Equal(t, 7, EnvInt("LEDGER_TEST_INT", 7))
	require.Equal(t, time.Second, EnvDuration("LEDGER_TEST_DURATION", time.Second))

	var s Service
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s.Register(fs, "")
	ok, err := s.Parse(fs, nil)
	require.False(t, ok)
	require.ErrorContains(t, err, `LEDGER_TEST_INT="forty" is not an integer`)
	require.ErrorContains(t, err, `LEDGER_TEST_DURATION="soon" is not a duration`)
}
