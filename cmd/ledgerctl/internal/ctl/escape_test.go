package ctl_test

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/pkg/wire"
)

// What a hostile worker puts in the strings ledgerctl prints: clear the
// screen, set the terminal's title, return the cursor to overwrite the line,
// reverse the rest of the line, and an 8-bit CSI.
const (
	clearScreen = "\x1b[2J"
	setTitle    = "\x1b]0;owned\x07"
	carriage    = "fake\rreal"
	reverseText = "\u202eevil"
	c1CSI       = "\u009b2J"
)

// requireNoControls fails if out holds a rune a terminal acts on.
func requireNoControls(t *testing.T, out string) {
	t.Helper()
	for _, bad := range []string{"\x1b", "\r", "\x07", "\u202e", "\u009b", "\x7f"} {
		require.NotContainsf(t, out, bad, "raw %q reached the terminal:\n%s", bad, out)
	}
}

// publishRaw publishes one message with the NATS protocol itself, as any
// client may: nats.go turns a CR in a header value into a space, a hand-made
// client does not.
func publishRaw(t *testing.T, natsURL, subject string, header [][2]string, body string) {
	t.Helper()
	u, err := url.Parse(natsURL)
	require.NoError(t, err)
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	r := bufio.NewReader(conn)
	info, err := r.ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(info, "INFO "), info)

	hdr := "NATS/1.0\r\n"
	for _, kv := range header {
		hdr += kv[0] + ": " + kv[1] + "\r\n"
	}
	hdr += "\r\n"
	_, err = fmt.Fprintf(conn, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1}\r\n"+
		"HPUB %s %d %d\r\n%s%s\r\nPING\r\n", subject, len(hdr), len(hdr)+len(body), hdr, body)
	require.NoError(t, err)
	pong, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "PONG\r\n", pong, "the server took the message")
}

// Dead letters carry whatever a worker sent, and where no authorization
// keeps them out (the development deployment) anyone can write a dead letter
// of their own: the table shows every such string escaped, and -json keeps
// the exact value.
func TestDLQListEscapesWhatWorkersSent(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withIngest(ingest.Config{})

	// Through the ingest: an invalid event's headers are kept in its dead
	// letter as they came.
	m := e.msg(event{partition: 3, task: "report-7", holder: "worker-a.1", generation: 1, version: 1, typ: "t"})
	m.Header.Set(wire.HeaderMsgID, clearScreen+setTitle)
	m.Header.Set(wire.HeaderType, reverseText+c1CSI)
	e.publishMsg(m)
	e.waitMsgs(wire.StreamDLQ, 1)
	// Forged, by hand: a CR survives only where no nats.go client rewrote
	// the headers.
	publishRaw(t, e.ns.URL(), e.subj.DLQ(4, "report-8"), [][2]string{
		{wire.HeaderMsgID, newID()}, {wire.HeaderHolder, carriage}, {wire.HeaderGeneration, "1"},
		{wire.HeaderVersion, "1"}, {wire.HeaderType, "t"},
		{wire.HeaderVerdict, "stale"}, {wire.HeaderReason, "superseded" + clearScreen},
		{wire.HeaderCurrentHolder, "\rworker-b"},
	}, `{}`)
	e.waitMsgs(wire.StreamDLQ, 2)

	r := e.run("dlq", "list").ok(t)
	requireNoControls(t, r.stdout)
	for _, shown := range []string{`\x1b[2J`, `\x1b]0;owned\a`, `fake\rreal`, `superseded\x1b[2J`} {
		assert.Contains(t, r.stdout, shown)
	}

	byHolder := map[string]map[string]any{}
	for _, d := range e.run("dlq", "list", "-json").ok(t).jsonLines(t) {
		byHolder[fmt.Sprint(d["holder"])] = d
	}
	require.Contains(t, byHolder, "worker-a.1", "the holder the subject named")
	require.Contains(t, byHolder, carriage, "-json keeps the exact holder")
	assert.Equal(t, clearScreen+setTitle, byHolder["worker-a.1"]["event_id"])
	assert.Equal(t, reverseText+c1CSI, byHolder["worker-a.1"]["type"])
	assert.Equal(t, "superseded"+clearScreen, byHolder[carriage]["reason"])

	// Replay refuses or would re-submit them, and says so, quoting what it
	// was given.
	r = e.run("dlq", "replay", "-seq", "1,2", "-dry-run")
	requireNoControls(t, r.stdout+r.stderr)
	assert.Contains(t, r.stdout+r.stderr, `\x1b[2J`)
}

// A committed payload is JSON, which may hold any printable-looking rune
// unescaped: a bidirectional override, a C1 control, DEL. task and tail
// show them as escapes.
func TestTaskAndTailEscapePayloadText(t *testing.T) {
	t.Parallel()
	e := newEnv(t).withIngest(ingest.Config{})
	l := e.acquire(5, "worker-a.1")
	payload := `{"note":"` + reverseText + c1CSI + "\x7f" + `"}`
	e.publish(event{partition: 5, task: "hostile", holder: "worker-a.1", generation: l.Generation, version: 1,
		typ: "step", payload: payload})
	e.waitCommitted("hostile", 1)

	r := e.run("task", "hostile").ok(t)
	requireNoControls(t, r.stdout)
	assert.Contains(t, r.stdout, `\u202eevil\u009b2J\x7f`)

	r = e.run("tail", "-n", "1", "-task", "hostile").ok(t)
	requireNoControls(t, r.stdout)
	assert.Contains(t, r.stdout, `\u202eevil\u009b2J\x7f`)

	lines := e.run("tail", "-n", "1", "-task", "hostile", "-json").ok(t).jsonLines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, map[string]any{"note": reverseText + c1CSI + "\x7f"}, lines[0]["payload"], "-json keeps the exact text")
}
