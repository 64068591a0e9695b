package sdktest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// proc is one example running as a real process, its stdout kept line by
// line.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // after done

	mu    sync.Mutex
	lines []string
}

func startProc(t *testing.T, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	p.cmd.Stderr = &prefixWriter{t: t, prefix: name + " stderr: "}
	require.NoError(t, p.cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// prefixWriter logs what a process writes to stderr.
type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Log(w.prefix + line)
	}
	return len(b), nil
}

func (p *proc) output() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// mark is the number of lines printed so far: waits from a mark look only
// at what was printed after it.
func (p *proc) mark() int { return len(p.output()) }

// waitFor waits until a line after mark matches re and returns its
// submatches and index.
func (p *proc) waitFor(mark int, re string, within time.Duration) ([]string, int) {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(within)
	for {
		lines := p.output()
		for i := mark; i < len(lines); i++ {
			if m := rx.FindStringSubmatch(lines[i]); m != nil {
				return m, i
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s printed no line matching %q within %v; its output:\n%s", p.name, re, within, strings.Join(lines, "\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
}

func (p *proc) exitCode(within time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(within):
		p.t.Fatalf("%s did not exit within %v", p.name, within)
		return -1
	}
}

// buildExamples builds the examples as an adopter would and returns the
// directory of their binaries.
func buildExamples(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	bin := t.TempDir()
	cmd := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "./examples/standby", "./examples/watcher")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build of the examples:\n%s", out)
	return bin
}

var committedRe = `(\S+): version (\d+) committed`

func atoi(t *testing.T, s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

// The examples, built and run as real processes against NATS, PostgreSQL,
// the ingest and the projector: a primary/standby pair of workers through a
// kill -9, a SIGSTOP past the TTL and a SIGTERM of the primary, and a
// watcher that prints each new version of the task.
//
// Not parallel: it sends signals on a timing of its own.
func TestExamplesSurviveKillStopAndTermOfThePrimary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the examples")
	}
	bin := buildExamples(t)
	l := newLedger(t)
	l.startProjector()
	ctx := testCtx(t, 3*time.Minute)
	// A TTL of 2 s keeps the kill's and the pause's takeovers short. The
	// worker that is sent SIGTERM (c) has one of 10 s, so that a takeover
	// that saw the release comes well before the lease's expiry, even on
	// a loaded machine.
	const task, ttl, termTTL = "report-1", 2 * time.Second, 10 * time.Second
	env := []string{"NATS_URL=" + l.ns.URL()}
	workerTTL := func(instance string, ttl time.Duration) *proc {
		return startProc(t, "reports."+instance, filepath.Join(bin, "standby"), env, "-principal", "reports",
			"-instance", instance, "-tasks", task, "-steps", "1000", "-every", "100ms", "-ttl", ttl.String())
	}
	worker := func(instance string) *proc { return workerTTL(instance, ttl) }
	watcher := startProc(t, "watcher", filepath.Join(bin, "watcher"), env, "-tasks", task)
	watcher.waitFor(0, `watching ledger_tasks`, 10*time.Second)

	a := worker("a")
	a.waitFor(0, `primary: holds partition (\d+) at generation 1`, 10*time.Second)
	b := worker("b")
	b.waitFor(0, `standby: waiting for partition`, 10*time.Second)
	m, _ := a.waitFor(0, task+`: version 3 committed`, 10*time.Second)
	require.NotNil(t, m)

	// kill -9: no release; the standby takes over once the lease expires.
	mb := b.mark()
	a.signal(syscall.SIGKILL)
	killed := time.Now()
	require.Equal(t, -1, a.exitCode(5*time.Second))
	m, _ = b.waitFor(mb, `primary: holds partition \d+ at generation (\d+)`, 10*time.Second)
	require.Equal(t, "2", m[1])
	m, _ = b.waitFor(mb, task+`: resuming after version (\d+)`, 5*time.Second)
	resumedAfter := atoi(t, m[1])
	m, _ = b.waitFor(mb, committedRe, 5*time.Second)
	require.Equal(t, resumedAfter+1, atoi(t, m[2]), "the standby did not resume after the head")
	t.Logf("kill -9: the standby committed version %s %v after the kill", m[2], time.Since(killed))

	// SIGSTOP past the TTL: a third worker, standing by, takes over; on
	// SIGCONT the paused one finds its lease lost and writes nothing.
	c := workerTTL("c", termTTL)
	c.waitFor(0, `standby: waiting for partition`, 10*time.Second)
	b.waitFor(b.mark(), committedRe, 5*time.Second)
	mc := c.mark()
	b.signal(syscall.SIGSTOP)
	stopped := time.Now()
	m, _ = c.waitFor(mc, `primary: holds partition \d+ at generation (\d+)`, 10*time.Second)
	require.Equal(t, "3", m[1])
	c.waitFor(mc, committedRe, 5*time.Second)
	time.Sleep(300 * time.Millisecond) // c writes on; b is still paused
	mb = b.mark()
	b.signal(syscall.SIGCONT)
	t.Logf("SIGSTOP: b was paused for %v", time.Since(stopped))
	_, lostAt := b.waitFor(mb, `lost partition \d+ \(generation 2\): worker: lease lost`, 5*time.Second)
	b.waitFor(lostAt, `standby: waiting for partition`, 5*time.Second)
	for _, line := range b.output()[mb:lostAt] {
		require.NotContains(t, line, "published", "b published after SIGCONT before it saw the loss")
	}
	// Nothing of generation 2 committed after generation 3 was granted;
	// stale verdicts, if any, only for what b had sent before the pause.
	granted3 := l.grantedAt(ctx, l.partitionOf(ctx, task), 3)
	require.Zero(t, l.count(`SELECT count(*) FROM ledger.events WHERE task_id = $1 AND generation = 2 AND committed_at > $2`,
		task, granted3))
	require.LessOrEqual(t, l.count(`SELECT count(*) FROM ledger.rejections WHERE holder = 'reports.b'`), 1)

	// SIGTERM: release, exit 0, and a standby takes over at once: by the
	// database's clock, before the lease would have expired unreleased.
	partition := l.partitionOf(ctx, task)
	var expiry time.Time
	require.NoError(t, l.db.Pool.QueryRow(ctx, `SELECT expires_at FROM ledger.leases WHERE partition = $1 AND generation = 3`,
		partition).Scan(&expiry))
	mb = b.mark()
	c.signal(syscall.SIGTERM)
	termed := time.Now()
	c.waitFor(0, `released partition \d+ \(generation 3\); exiting`, 10*time.Second)
	require.Equal(t, 0, c.exitCode(10*time.Second))
	m, _ = b.waitFor(mb, `primary: holds partition \d+ at generation (\d+)`, termTTL)
	require.Equal(t, "4", m[1])
	tookOver := time.Since(termed)
	require.True(t, l.grantedAt(ctx, partition, 4).Before(expiry),
		"the standby waited for the released lease's expiry (%v after the signal)", tookOver)
	m, _ = b.waitFor(mb, committedRe, 5*time.Second)
	last := atoi(t, m[2])
	t.Logf("SIGTERM: the standby took over %v after the signal", tookOver)

	// Every version is dense and the watcher saw the task move forward to
	// b's latest, in order.
	rows := l.events(task)
	for i, r := range rows {
		require.Equal(t, int64(i+1), r.Version)
	}
	watcher.waitFor(0, fmt.Sprintf(`%s: version %d running`, task, last), 10*time.Second)
	var prev int64
	seen := 0
	for _, line := range watcher.output() {
		if m := regexp.MustCompile(task + `: version (\d+) `).FindStringSubmatch(line); m != nil {
			v := atoi(t, m[1])
			require.Greater(t, v, prev, "the watcher went back: %s", line)
			prev = v
			seen++
		}
	}
	t.Logf("the watcher printed %d of the task's first %d versions", seen, last)

	b.signal(syscall.SIGTERM)
	require.Equal(t, 0, b.exitCode(10*time.Second))
	watcher.signal(syscall.SIGTERM)
	require.Equal(t, 0, watcher.exitCode(10*time.Second))
	for _, p := range []*proc{a, b, c, watcher} {
		t.Logf("output of %s:\n%s", p.name, strings.Join(p.output(), "\n"))
	}
}
