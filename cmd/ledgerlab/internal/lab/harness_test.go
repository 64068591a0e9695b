package lab_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/cmd/ledgerlab/internal/lab"
)

// result is what one ledgerlab run printed and returned.
type result struct {
	code           int
	stdout, stderr string
}

// run drives ledgerlab through the entry point the binary uses.
func run(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := lab.Run(ctx, args, &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// ok fails the test unless the run succeeded.
func (r result) ok(t *testing.T) result {
	t.Helper()
	require.Equal(t, 0, r.code, "exit status; stderr:\n%s\nstdout:\n%s", r.stderr, r.stdout)
	return r
}
