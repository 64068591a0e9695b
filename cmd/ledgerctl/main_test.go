package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain lets a test run this binary's main: the test binary re-executes
// itself with LEDGERCTL_RUN_MAIN set.
func TestMain(m *testing.M) {
	if os.Getenv("LEDGERCTL_RUN_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func ledgerctl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "LEDGERCTL_RUN_MAIN=1")
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), out.String(), errb.String()
	}
	require.NoError(t, err)
	return 0, out.String(), errb.String()
}

func TestExitStatusOfTheBinary(t *testing.T) {
	t.Parallel()
	code, stdout, _ := ledgerctl(t, "version")
	assert.Equal(t, 0, code)
	assert.Contains(t, stdout, "ledgerctl")

	code, _, stderr := ledgerctl(t, "no-such-command")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "Usage: ledgerctl")

	code, _, stderr = ledgerctl(t, "-nats-url", "nats://127.0.0.1:1", "dlq", "list")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "NATS")
}
