package sdktest

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The effects example, built and run as processes: a worker records two
// intents, and of two runner processes one performs each intent once, with
// the intent's event id as its key.
func TestEffectsExampleRunsEachRecordedIntent(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	bin := t.TempDir()
	cmd := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "./examples/effects")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build of the example:\n%s", out)

	l := newLedger(t)
	env := []string{"NATS_URL=" + l.ns.URL()}
	exe := filepath.Join(bin, "effects")
	r1 := startProc(t, "runner-1", exe, env, "-runner", "-instance", "r1")
	r1.waitFor(0, `consuming effects-mailer`, 20*time.Second)
	r2 := startProc(t, "runner-2", exe, env, "-runner", "-instance", "r2")
	r2.waitFor(0, `consuming effects-mailer`, 20*time.Second)
	w := startProc(t, "worker", exe, env, "-intents", "2", "-task", "order-1")
	require.Equal(t, 0, w.exitCode(60*time.Second), "worker output: %v", w.output())
	var ids []string
	for _, line := range w.output() {
		if m := regexpFind(`recorded intent (\S+) \(version \d+\) under fence \d+:mailer\.\S+:1`, line); m != nil {
			ids = append(ids, m[1])
		}
	}
	require.Len(t, ids, 2, "worker output: %v", w.output())
	require.Eventually(t, func() bool {
		n := 0
		for _, p := range []*proc{r1, r2} {
			for _, line := range p.output() {
				if m := regexpFind(`effect (\S+) of order-1: .* \(delivery 1, decided by \d+:mailer\.`, line); m != nil {
					require.Contains(t, ids, m[1])
					n++
				}
			}
		}
		return n == len(ids)
	}, 30*time.Second, 20*time.Millisecond, "runner 1: %v\nrunner 2: %v", r1.output(), r2.output())
}

func regexpFind(re, s string) []string { return regexp.MustCompile(re).FindStringSubmatch(s) }
