package deploytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// binDir holds the binaries built by buildBinary, shared by every test.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deploytest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploytest:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir) //nolint:errcheck
	os.Exit(code)
}

// repoRoot is the module's root directory: the deployment files live there.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("deploytest: no go.mod above the test's directory")
		}
		dir = parent
	}
}

// repoFile returns the path of a file given relative to the repository root.
func repoFile(t testing.TB, rel string) string {
	t.Helper()
	return filepath.Join(repoRoot(t), filepath.FromSlash(rel))
}

// readRepoFile returns the contents of a file of the repository.
func readRepoFile(t testing.TB, rel string) string {
	t.Helper()
	b, err := os.ReadFile(repoFile(t, rel))
	if err != nil {
		t.Fatalf("deploytest: %v", err)
	}
	return string(b)
}

type built struct {
	once sync.Once
	path string
	err  error
}

var (
	buildsMu sync.Mutex
	builds   = map[string]*built{}
)

// buildBinary builds ./cmd/<name> the way the Dockerfile does (static,
// trimmed paths) once per test process and returns its path. A command that
// does not exist or does not compile fails the test with the reason.
func buildBinary(t testing.TB, name string) string {
	t.Helper()
	buildsMu.Lock()
	b := builds[name]
	if b == nil {
		b = &built{}
		builds[name] = b
	}
	buildsMu.Unlock()
	root := repoRoot(t)
	b.once.Do(func() { b.path, b.err = goBuild(root, name) })
	if b.err != nil {
		t.Fatalf("deploytest: %v", b.err)
	}
	return b.path
}

func goBuild(root, name string) (string, error) {
	pkg := "./cmd/" + name
	if _, err := os.Stat(filepath.Join(root, "cmd", name)); errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%s does not exist, but the Dockerfile builds it and docker-compose.yml runs it", pkg)
	}
	out := filepath.Join(binDir, name)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, msg)
	}
	return out, nil
}

// helpText runs the binary with args followed by -h and returns what it
// printed. Its environment is empty but for PATH and HOME, so defaults come
// from the code, not from the machine. Exit status is not checked: some
// flag packages exit 0 on -h, others 2.
func helpText(t testing.TB, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(append([]string(nil), args...), "-h")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("deploytest: %s %s -h did not exit within 30s (does it handle -h?)\n%s",
			filepath.Base(bin), strings.Join(args, " "), out.String())
	}
	if strings.TrimSpace(out.String()) == "" {
		t.Fatalf("deploytest: %s %s -h printed nothing", filepath.Base(bin), strings.Join(args, " "))
	}
	return out.String()
}

// helpHasFlag reports whether the usage text of a Go flag set lists the flag
// (a line starting with -name or --name).
func helpHasFlag(help, name string) bool {
	re := regexp.MustCompile(`(?m)^\s*--?` + regexp.QuoteMeta(name) + `(\s|=|,|$)`)
	return re.MatchString(help)
}

// helpHasWord reports whether word appears in text as a whole word, such as
// an environment variable's name.
func helpHasWord(text, word string) bool {
	return regexp.MustCompile(`\b` + regexp.QuoteMeta(word) + `\b`).MatchString(text)
}
