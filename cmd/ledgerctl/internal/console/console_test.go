package console_test

import (
	"bufio"
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/wire"
)

// staleLetter makes worker-a's late write on partition 3 a stale dead
// letter: it commits version 1 at generation 1, loses the partition to
// worker-b, then sends version 2 under generation 1. It returns the
// letter's LEDGER_DLQ sequence.
func (l *ledger) staleLetter(task, payload string) uint64 {
	l.t.Helper()
	a := l.acquire(3, "worker-a.1")
	l.publish(event{partition: 3, task: task, holder: "worker-a.1", generation: a.Generation, version: 1, typ: "started", payload: `{"step":1}`})
	l.waitCommitted(task, 1)
	ledgertest.ExpireLease(l.t, l.db.Pool, 3)
	b := l.acquire(3, "worker-b.1")
	require.Greater(l.t, b.Generation, a.Generation)
	before := l.lastDLQSeqOrZero()
	l.publish(event{partition: 3, task: task, holder: "worker-a.1", generation: a.Generation, version: 2, typ: "completed", payload: payload})
	l.waitStream(wire.StreamDLQ, 1)
	require.Eventually(l.t, func() bool { return l.lastDLQSeqOrZero() > before }, 20*time.Second, 10*time.Millisecond)
	return l.lastDLQSeq()
}

func (l *ledger) lastDLQSeqOrZero() uint64 {
	s, err := l.js.Stream(context.Background(), wire.StreamDLQ)
	if err != nil {
		return 0
	}
	info, err := s.Info(context.Background())
	if err != nil {
		return 0
	}
	return info.State.LastSeq
}

// A page elsewhere can point its own host name at 127.0.0.1 (DNS
// rebinding) and read whatever answers there: the console answers only to
// the names of the address it listens on.
func TestConsoleAnswersOnlyToItsOwnHostNames(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	base := l.console()
	port := strings.TrimPrefix(base, "http://127.0.0.1:")

	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port} {
		code, _, body := get(t, base+"/", "Host", host)
		assert.Equal(t, http.StatusOK, code, "Host %s: %s", host, body)
	}
	for _, host := range []string{"attacker.example:" + port, "attacker.example", "127.0.0.1.attacker.example:" + port} {
		code, _, body := get(t, base+"/flow", "Host", host)
		assert.Equal(t, http.StatusMisdirectedRequest, code, "Host %s must be refused", host)
		assert.NotContains(t, body, "LEDGER_LOG", "a refused request shows nothing of the ledger")
	}
}

// Every page says, in its headers, that it runs only the console's own
// script, is framed by nobody and gives other sites no referrer.
func TestPagesCarryTheirSecurityPolicy(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	seq := l.staleLetter("report-7", `{"done":true}`)
	base := l.console()
	for _, path := range []string{"/", "/flow", "/dlq", "/dlq/" + itoa(seq), "/task/report-7", "/task", "/frag/flow", "/static/console.js"} {
		code, h, body := get(t, base+path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
		csp := h.Get("Content-Security-Policy")
		assert.Contains(t, csp, "script-src 'self'", path)
		assert.Contains(t, csp, "frame-ancestors 'none'", path)
		assert.Contains(t, csp, "form-action 'self'", path)
		assert.NotContains(t, csp, "unsafe-inline", path)
		assert.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), path)
		assert.Equal(t, "DENY", h.Get("X-Frame-Options"), path)
		assert.Equal(t, "same-origin", h.Get("Referrer-Policy"), path)
		assert.NotContains(t, body, "<script>", "%s: no inline script", path)
	}
}

var formToken = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// openLetter loads a dead letter's page as a browser does: its replay
// form's token and the cookie that goes with it.
func openLetter(t *testing.T, base string, seq uint64) (token string, cookies []*http.Cookie, body string) {
	t.Helper()
	resp, err := http.Get(base + "/dlq/" + itoa(seq))
	require.NoError(t, err)
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	require.Equal(t, http.StatusOK, resp.StatusCode, b.String())
	if m := formToken.FindStringSubmatch(b.String()); m != nil {
		token = m[1]
	}
	return token, resp.Cookies(), b.String()
}

// Without -allow-replay the console changes nothing: no page offers a
// replay, and a POST that would be valid otherwise is refused, with
// LEDGER_IN untouched.
func TestReadOnlyConsoleRefusesReplays(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	seq := l.staleLetter("report-7", `{"done":true}`)
	base := l.console()

	token, cookies, body := openLetter(t, base, seq)
	assert.Empty(t, token, "a read-only console issues no replay token")
	assert.NotContains(t, body, "<form method=\"post\"")
	assert.Contains(t, body, "Replay is disabled")
	in := l.inLast()

	code, body := post(t, base+"/dlq/"+itoa(seq)+"/replay", url.Values{"csrf": {"x"}, "new_id": {"1"}}, cookies,
		"Origin", base, "Sec-Fetch-Site", "same-origin")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "replay is disabled")
	code, _, _ = get(t, base+"/dlq/"+itoa(seq)+"/replay")
	assert.Equal(t, http.StatusMethodNotAllowed, code, "GET never replays")
	assert.Equal(t, in, l.inLast(), "nothing was published to LEDGER_IN")
}

// With -allow-replay, a replay needs the token of the console's own page,
// the cookie it came with, and a request from the console's origin; each
// forgery is refused and publishes nothing. The genuine one goes through
// "ledgerctl dlq replay" and brings the new verdict.
func TestReplayNeedsTheConsolesOwnPage(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	seq := l.staleLetter("report-7", `{"done":true}`)
	base := l.console("-allow-replay")
	token, cookies, _ := openLetter(t, base, seq)
	require.NotEmpty(t, token)
	require.NotEmpty(t, cookies)
	replayURL := base + "/dlq/" + itoa(seq) + "/replay"
	good := url.Values{"csrf": {token}, "new_id": {"1"}}
	in := l.inLast()

	otherToken, otherCookies, _ := openLetter(t, base, seq) // another browser's pair
	forgeries := []struct {
		name    string
		form    url.Values
		cookies []*http.Cookie
		header  []string
	}{
		{"no token", url.Values{"new_id": {"1"}}, cookies, []string{"Origin", base, "Sec-Fetch-Site", "same-origin"}},
		{"a made-up token", url.Values{"csrf": {"AAAA"}, "new_id": {"1"}}, cookies, []string{"Origin", base}},
		{"no cookie", good, nil, []string{"Origin", base, "Sec-Fetch-Site", "same-origin"}},
		{"another browser's cookie", good, otherCookies, []string{"Origin", base}},
		{"another browser's token", url.Values{"csrf": {otherToken}}, cookies, []string{"Origin", base}},
		{"from another site", good, cookies, []string{"Origin", "http://attacker.example", "Sec-Fetch-Site", "cross-site"}},
		{"from another port of this host", good, cookies, []string{"Origin", "http://127.0.0.1:1", "Sec-Fetch-Site", "same-site"}},
		{"no Origin", good, cookies, nil},
		{"a same-site fetch with the right Origin", good, cookies, []string{"Origin", base, "Sec-Fetch-Site", "same-site"}},
	}
	for _, f := range forgeries {
		code, body := post(t, replayURL, f.form, f.cookies, f.header...)
		assert.Equal(t, http.StatusForbidden, code, "%s: %s", f.name, body)
		assert.Contains(t, body, "replay refused", f.name)
	}
	assert.Equal(t, in, l.inLast(), "no forgery published anything to LEDGER_IN")

	code, body := post(t, replayURL, good, cookies, "Origin", base, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `id="result">submitted`)
	assert.Contains(t, body, "stale/superseded", "the replayed event keeps its generation: stale again")
	assert.Greater(t, l.inLast(), in, "the replay was published to LEDGER_IN")
}

// What a worker wrote is shown as text: markup in a header, a type or a
// body never becomes markup on the page.
func TestWorkerStringsAreShownAsText(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	const hostile = `<img src=x onerror=alert(1)><script>alert(2)</script>`
	m := nats.NewMsg(l.subj.In("worker-a.1", 3, "report-7"))
	m.Header.Set(wire.HeaderMsgID, ledgertest.NewID())
	m.Header.Set(wire.HeaderGeneration, "1")
	m.Header.Set(wire.HeaderVersion, "1")
	m.Header.Set(wire.HeaderType, hostile) // invalid/bad_type
	m.Header.Set("X-Note", hostile+"\r\n\u202e")
	m.Data = []byte(hostile)
	l.publishMsg(m)
	l.waitStream(wire.StreamDLQ, 1)
	seq := l.lastDLQSeq()
	base := l.console()

	for _, path := range []string{"/dlq/" + itoa(seq), "/dlq", "/frag/dlq"} {
		body := eventually(t, base+path, "bad_type")
		assert.NotContains(t, body, "<img src=x", path)
		assert.NotContains(t, body, "<script>alert", path)
		assert.Contains(t, body, "&lt;img src=x onerror=alert(1)&gt;", path)
	}
}

// A console's pages never show the credentials it connects with, even when
// what it reads from is missing.
func TestPagesShowNoCredentials(t *testing.T) {
	t.Parallel()
	const natsSecret, pgSecret = "nats-s3cret-pw", "pg-s3cret-pw"
	l := newLedger(t, natstest.WithUserPassword("ops", natsSecret))
	l.natsArgs = []string{"-nats-user", "ops", "-nats-password", natsSecret}
	u, err := url.Parse(l.db.URL)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), pgSecret) // trust auth ignores it
	l.db.URL = u.String()
	seq := l.staleLetter("report-7", `{}`)
	// An unreachable scrape fails with its URL in the error, token and all.
	base := l.console("-allow-replay", "-ingest-metrics", "http://user:"+pgSecret+"@127.0.0.1:1/metrics?token="+pgSecret)

	eventually(t, base+"/flow", "metrics could not be read")
	for _, path := range []string{"/", "/flow", "/dlq", "/dlq/" + itoa(seq), "/task/report-7", "/frag/partitions", "/frag/flow", "/dlq/99999"} {
		_, _, body := get(t, base+path)
		for _, secret := range []string{natsSecret, pgSecret, l.db.URL, l.ns.URL()} {
			assert.NotContains(t, body, secret, path)
		}
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
