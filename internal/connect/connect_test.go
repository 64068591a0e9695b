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

// A password in a NATS URL never reaches an error: not in a URL without a
// scheme, nor in one the client cannot parse and quotes whole.
func TestPasswordInNATSURLIsNeverPrinted(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"nats://user:s3cret@127.0.0.1:1",
		"user:s3cret@127.0.0.1:1",
		"nats://user:s3cret@[::1",
		"user:s3cret@host with space:1",
		"nats://s3cret@127.0.0.1:1,user:s3cret@127.0.0.1:2",
		"nats://user:p@ss:s3cret@127.0.0.1:1",
	} {
		o := Options{NATSURL: u}
		_, err := o.NATS(nil)
		require.Error(t, err, u)
		require.NotContains(t, err.Error(), "s3cret", u)
		require.Contains(t, err.Error(), "redacted", u)
		require.NotContains(t, RedactURLs(u), "s3cret", u)
	}
	require.Equal(t, "nats://127.0.0.1:4222", RedactURLs("nats://127.0.0.1:4222"))
}
