package lab_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestChaosArgumentsThatCannotRun(t *testing.T) {
	t.Parallel()
	empty := t.TempDir()
	for _, c := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"zero partitions", []string{"chaos", "-partitions", "0"}, 2, "partitions must be 1..1024, got 0"},
		{"zero duration", []string{"chaos", "-duration", "0s"}, 2, "duration must be positive"},
		{"a TTL below the contract's", []string{"chaos", "-ttl", "50ms"}, 2, "the TTL must be whole milliseconds"},
		{"an argument", []string{"chaos", "now"}, 2, `unexpected argument "now"`},
		{"external without a database", []string{"chaos", "-external", "-database-url", ""}, 2, "-external needs DATABASE_URL"},
		{"no binaries", []string{"chaos", "-bin", empty, "-duration", "1s"}, 1, "binary not found: " + empty + "/ledgerlab"},
		{"writer without a holder", []string{"chaos", "writer", "-partition", "1"}, 2, "-holder, -partition, -tasks, -task-prefix and -log are required"},
		{"check without logs", []string{"chaos", "check"}, 2, "-logs is required"},
		{"check of a directory without logs", []string{"chaos", "check", "-logs", empty}, 1, "no writer logs"},
		{"nats without a port", []string{"chaos", "nats", "-name", "n1"}, 2, "-name, -port and -store are required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := run(t, c.args...)
			assert.Equal(t, c.code, r.code, "stderr:\n%s", r.stderr)
			assert.Contains(t, r.stderr, c.stderr)
		})
	}
}

func TestChaosHasItsUsage(t *testing.T) {
	t.Parallel()
	r := run(t, "help", "chaos").ok(t)
	assert.Contains(t, r.stdout, "Usage: ledgerlab chaos")
	assert.Contains(t, r.stdout, "-sigstop-every")
	r = run(t, "chaos", "writer", "-h").ok(t)
	assert.Contains(t, r.stdout+r.stderr, "Usage: ledgerlab chaos writer")
}
