package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A Go team that imports only the SDK gets nats.go and ulid (and what
// nats.go itself needs) in its go.mod, and nothing of the services: no
// nats-server, pgx, Prometheus or test libraries.
func TestAdopterOfTheSDKGetsNothingOfTheServices(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	dir := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	write("go.mod", "module example.com/adopter\n\ngo 1.26.0\n\n"+
		"replace github.com/flowness/ledger/pkg/worker => "+filepath.Join(root, "pkg/worker")+"\n"+
		"replace github.com/flowness/ledger/pkg/wire => "+filepath.Join(root, "pkg/wire")+"\n")
	write("main.go", `package main

import (
	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/pkg/worker"
)

func main() {
	nc, err := nats.Connect(nats.DefaultURL, worker.InboxOption("reports.pod-1"))
	if err != nil {
		return
	}
	_, _ = worker.New(nc, worker.Config{Holder: "reports.pod-1"})
}
`)
	run := func(args ...string) string {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	run("mod", "tidy")
	run("build", "./...")
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	require.NoError(t, err)
	t.Logf("the adopter's go.mod:\n%s", gomod)
	var required []string
	for _, line := range strings.Split(string(gomod), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.Contains(f[0], ".") && !strings.HasPrefix(line, "replace") && !strings.HasPrefix(line, "module") {
			required = append(required, f[0])
		}
	}
	allowed := map[string]bool{
		"github.com/flowness/ledger/pkg/worker": true, "github.com/flowness/ledger/pkg/wire": true,
		"github.com/nats-io/nats.go": true, "github.com/oklog/ulid/v2": true,
		// nats.go's own needs
		"github.com/klauspost/compress": true, "github.com/nats-io/nkeys": true, "github.com/nats-io/nuid": true,
		"golang.org/x/crypto": true, "golang.org/x/sys": true,
	}
	require.NotEmpty(t, required)
	for _, m := range required {
		require.True(t, allowed[m], "the adopter's go.mod requires %s:\n%s", m, gomod)
	}
}
