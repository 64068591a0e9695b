package console_test

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
)

// chromiumPath is Debian's Chromium; LEDGER_CHROMIUM names another.
func chromiumPath(t *testing.T) string {
	t.Helper()
	path := cmp.Or(os.Getenv("LEDGER_CHROMIUM"), "/usr/bin/chromium")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the console's browser test needs Chromium at %s (on Debian: apt-get install -y chromium; "+
			".ci/run installs it when missing; LEDGER_CHROMIUM names another binary): %v", path, err)
	}
	return path
}

// browser starts a headless Chromium with a fresh profile, quiet on the
// network (the machine may have none), for the rest of the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1360, 900))
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	_, err := chromedp.Run(ctx, chromedp.Title()) // starts the browser
	require.NoError(t, err, "start Chromium")
	return ctx
}

// do runs browser actions with a deadline.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, steps...), what)
}

// until waits for a JavaScript condition on the page. It asks again while
// a navigation is under way (the page's context is then gone for a moment).
func until(t *testing.T, ctx context.Context, what, cond string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var ok bool
		ok, err = chromedp.Run(actx, chromedp.Evaluate[bool]("!!("+cond+")"))
		cancel()
		if err == nil && ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, _ := chromedp.Run(actx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	t.Fatalf("%s: not so within 20s (last error: %v); the page shows:\n%s", what, err, body)
}

// eval runs a JavaScript expression on the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	require.NoError(t, err, expr)
	return v
}

// mark tags the page that is loaded now; reloaded tells whether another
// page replaced it since.
func mark(t *testing.T, ctx context.Context) {
	t.Helper()
	eval[bool](t, ctx, `(window.__ledgerTestMark = true)`)
}

func reloaded(t *testing.T, ctx context.Context) bool {
	t.Helper()
	return !eval[bool](t, ctx, `window.__ledgerTestMark === true`)
}

// screenshot keeps a picture of the page in $LEDGER_SCREENSHOTS (relative
// to the repository's root) as console-<name>.png.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("LEDGER_SCREENSHOTS")
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(repoRoot(t), dir)
	}
	// The countdown and the charts move: let the page settle on a frame.
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "console-"+name+".png"), png, 0o644))
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil && !strings.Contains(dir, filepath.Join("pkg", "")) {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "no go.mod above the test")
		dir = parent
	}
}

// An operator's session, in a real browser against a real ledger: the
// partitions view shows a takeover as it happens, the dead-letter list
// shows a new letter without a reload, a letter opens with its headers and
// body, a replay goes through only where it is allowed and only from the
// console's own page, and the task and flow views show what the ledger
// did. Screenshots of each page go to $LEDGER_SCREENSHOTS when it is set.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	l := newLedger(t)
	a := l.acquire(3, "worker-a.1")
	l.acquire(5, "reports.pod-7")
	l.publish(event{partition: 3, task: "invoice-42", holder: "worker-a.1", generation: a.Generation, version: 1,
		typ: "started", payload: `{"customer":"acme","lines":2}`})
	l.waitCommitted("invoice-42", 1)
	base := l.console("-allow-replay")

	// Partitions: worker-a holds partition 3; worker-a.2 (a standby of the
	// same principal: a task is its first writer's) takes it over while the
	// page is open.
	do(t, ctx, "open the partitions view", chromedp.Navigate(base+"/"))
	until(t, ctx, "partition 3 shows worker-a", `document.querySelector('#partition-3 .holder')?.textContent === 'worker-a.1'`)
	until(t, ctx, "the page follows the live stream", `document.getElementById('status')?.textContent === 'live'`)
	mark(t, ctx)
	ledgertest.ExpireLease(t, l.db.Pool, 3)
	b := l.acquire(3, "worker-a.2")
	until(t, ctx, "the takeover appears on partition 3's tile",
		`(() => { const t = document.getElementById('partition-3');
		  return t && t.classList.contains('takeover') && t.querySelector('.holder').textContent === 'worker-a.2'
		    && t.querySelector('.gen b').textContent === '`+strconv.FormatInt(b.Generation, 10)+`'
		    && t.querySelector('.takeovers b').textContent === '1'; })()`)
	require.False(t, reloaded(t, ctx), "the takeover came in without a reload")
	screenshot(t, ctx, "partitions")

	// Dead letters: worker-a's late write arrives while the list is open.
	do(t, ctx, "open the dead-letter list", chromedp.Navigate(base+"/dlq"))
	until(t, ctx, "the list is live", `document.getElementById('status')?.textContent === 'live'`)
	require.Equal(t, "0", eval[string](t, ctx, `document.querySelector('.matched').textContent`))
	mark(t, ctx)
	l.publish(event{partition: 3, task: "invoice-42", holder: "worker-a.1", generation: a.Generation, version: 2,
		typ: "completed", payload: `{"total":"<b>120.00</b>","note":"late write of the paused worker"}`})
	until(t, ctx, "the stale letter appears in the list",
		`[...document.querySelectorAll('tr[id^="letter-"]')].some(r => r.textContent.includes('superseded') && r.textContent.includes('invoice-42'))`)
	require.False(t, reloaded(t, ctx), "the letter came in without a reload")
	// Worker-b's own writes commit, so the task has two generations.
	l.publish(event{partition: 3, task: "invoice-42", holder: "worker-a.2", generation: b.Generation, version: 2,
		typ: "completed", payload: `{"total":"120.00","by":"B"}`})
	l.publish(event{partition: 5, task: "report-7", holder: "reports.pod-7", generation: 1, version: 1,
		typ: "running", payload: `{"pct":50}`})
	l.waitCommitted("invoice-42", 2)
	screenshot(t, ctx, "dlq")

	// Open the letter: its headers and its body, as text.
	seq := l.lastDLQSeq()
	do(t, ctx, "open the letter", chromedp.Click(chromedp.CSS(fmt.Sprintf("#letter-%d a", seq))))
	until(t, ctx, "the letter's page shows its body", `document.getElementById('body')?.textContent.includes('"total": "<b>120.00</b>"')`)
	require.Zero(t, eval[int](t, ctx, `document.querySelectorAll('#body b').length`), "the body's markup is text")
	require.True(t, eval[bool](t, ctx, `[...document.querySelectorAll('.headers th')].some(th => th.textContent === 'Ledger-Type')`))
	screenshot(t, ctx, "letter")

	// A page on another origin posts to the replay: refused.
	in := l.inLast()
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id="f" method="post" action="%s/dlq/%d/replay"><input name="new_id" value="1">
<input name="csrf" value="guessed"></form><script>document.getElementById('f').submit()</script>`, base, seq)
	}))
	defer evil.Close()
	do(t, ctx, "visit the forging page", chromedp.Navigate(evil.URL))
	until(t, ctx, "the forged replay is refused", `document.getElementById('error')?.textContent.includes('replay refused')`)
	require.Equal(t, in, l.inLast(), "the forged replay published nothing")

	// The real replay, from the letter's page, under a new event id.
	do(t, ctx, "replay the letter", chromedp.Navigate(fmt.Sprintf("%s/dlq/%d", base, seq)),
		chromedp.WaitVisible(chromedp.ID("replay")), chromedp.Click(chromedp.ID("new-id")), chromedp.Click(chromedp.ID("replay")))
	until(t, ctx, "the replay is submitted and judged", `document.getElementById('result')?.textContent.startsWith('submitted')
		&& document.getElementById('verdict')?.textContent === 'stale/superseded'`)
	require.Greater(t, l.inLast(), in)
	screenshot(t, ctx, "replay")

	// The task: its two generations, its rejections, and its projection
	// beside the fold of its log.
	do(t, ctx, "open the task", chromedp.Navigate(base+"/task/invoice-42"))
	until(t, ctx, "the task shows both versions and the generation change",
		`document.getElementById('version-2') && document.querySelector('tr.generation-change')?.textContent.includes('worker-a.2')`)
	until(t, ctx, "the projection catches up with the log", `document.getElementById('compare')?.classList.contains('match')`)
	require.GreaterOrEqual(t, eval[int](t, ctx, `document.querySelectorAll('table.rejections tbody tr').length`), 1)
	screenshot(t, ctx, "task")

	// Flow: the commits and the stale rejections, and the projector.
	do(t, ctx, "open the flow view", chromedp.Navigate(base+"/flow"))
	until(t, ctx, "the flow counts the commits and the rejections",
		`Number(document.querySelector('#chart-committed .total')?.textContent) >= 3
		 && Number(document.querySelector('#chart-stale .total')?.textContent) >= 2
		 && document.getElementById('projector-projector') !== null`)
	screenshot(t, ctx, "flow")

	// A read-only console offers no replay, and refuses one even from its
	// own page.
	ro := l.console()
	do(t, ctx, "open the letter on a read-only console", chromedp.Navigate(fmt.Sprintf("%s/dlq/%d", ro, seq)))
	until(t, ctx, "the page says replay is disabled", `document.getElementById('replay-disabled') !== null`)
	require.Zero(t, eval[int](t, ctx, `document.querySelectorAll('form.replay').length`))
	in = l.inLast()
	status := eval[int](t, ctx, fmt.Sprintf(`fetch('/dlq/%d/replay', {method: 'POST', body: new URLSearchParams({new_id: '1'})}).then(r => r.status)`, seq))
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, in, l.inLast(), "a read-only console published nothing")
}
