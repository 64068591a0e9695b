package admin

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A failure that lasts is logged again once a minute has passed; another
// error of the same check is news and is logged at once.
func TestFailureLogRepeatsAtMostOnceAMinute(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	f := newFailureLog(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	down := errors.New("connection refused")
	lines := func() int { return strings.Count(buf.String(), "\n") }

	f.report("postgres", down)
	require.Equal(t, 1, lines())
	now = now.Add(59 * time.Second)
	f.report("postgres", down)
	require.Equal(t, 1, lines(), "the same error within a minute")
	f.report("postgres", errors.New("password authentication failed"))
	require.Equal(t, 2, lines(), "a different error of the same check")
	f.report("nats", down)
	require.Equal(t, 3, lines(), "the same error of another check")
	now = now.Add(time.Second)
	f.report("postgres", down)
	require.Equal(t, 4, lines(), "a minute after it was last logged")
}

// Error texts that never repeat (they carry a counter, a port) cannot grow
// the memory of what was logged without bound.
func TestFailureLogForgetsPastItsBound(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	f := newFailureLog(slog.New(slog.DiscardHandler), func() time.Time { return now })
	for i := range 10 * failureLogMax {
		now = now.Add(time.Millisecond)
		f.report("postgres", fmt.Errorf("dial 10.0.0.1:%d: refused", i))
	}
	require.LessOrEqual(t, len(f.logged), failureLogMax)
}
