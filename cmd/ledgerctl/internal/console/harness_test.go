package console_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/ctl"
	"github.com/flowness/ledger/internal/admin"
	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/projection"
	"github.com/flowness/ledger/pkg/wire"
)

// ledger is one test's whole ledger: its own database, an embedded NATS
// server, an ingest (with the lease service) and a projector.
type ledger struct {
	t         *testing.T
	db        *dbtest.DB
	ns        *natstest.Server
	nc        *nats.Conn
	js        jetstream.JetStream
	store     *fence.Store
	subj      wire.Subjects
	projector *projector.Service
	// metricsURL is the ingest's /metrics.
	metricsURL string
	natsArgs   []string
}

func newLedger(t *testing.T, opts ...natstest.Option) *ledger {
	t.Helper()
	l := &ledger{t: t, db: dbtest.New(t), ns: natstest.Start(t, opts...)}
	l.nc, l.js = l.ns.Conn(t), l.ns.JetStream(t)
	var err error
	l.store, err = fence.New(l.db.Pool, fence.Config{})
	require.NoError(t, err)
	reg := admin.NewRegistry()
	in, err := ingest.New(ingest.Config{}, ingest.Deps{NC: l.ns.Conn(t), Store: l.store, Logger: ledgertest.Logger(), Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, in.Start(context.Background()))
	t.Cleanup(in.Stop)
	srv, err := admin.Start("127.0.0.1:0", reg, nil, ledgertest.Logger())
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	l.metricsURL = "http://" + srv.Addr() + "/metrics"
	l.startProjector()
	return l
}

func (l *ledger) startProjector() {
	l.t.Helper()
	p, err := projector.New(projector.Config{Engine: projection.Config{GapTimeout: time.Second}},
		projector.Deps{NC: l.ns.Conn(l.t), Pool: l.db.Pool, Logger: ledgertest.Logger()})
	require.NoError(l.t, err)
	require.NoError(l.t, p.Start(context.Background()))
	l.t.Cleanup(p.Stop)
	l.projector = p
}

// console runs "ledgerctl console" on this ledger, on a free loopback
// port, until the test ends, and returns the URL it prints.
func (l *ledger) console(args ...string) string {
	l.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errs ledgertest.Buffer
	done := make(chan int)
	all := append([]string{"-database-url", l.db.URL, "-nats-url", l.ns.URL()}, l.natsArgs...)
	all = append(all, append([]string{"console", "-listen", "127.0.0.1:0", "-poll", "200ms"}, args...)...)
	go func() { done <- ctl.Run(ctx, all, &out, &errs) }()
	l.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			l.t.Errorf("ledgerctl console did not stop within 10s")
		}
	})
	re := regexp.MustCompile(`ledger console on (http://127\.0\.0\.1:\d+/)`)
	var u string
	require.Eventually(l.t, func() bool {
		select {
		case code := <-done:
			l.t.Fatalf("ledgerctl console exited with %d:\n%s%s", code, out.String(), errs.String())
		default:
		}
		m := re.FindStringSubmatch(out.String())
		if m != nil {
			u = m[1]
		}
		return m != nil
	}, 20*time.Second, 20*time.Millisecond, "ledgerctl console did not say where it listens")
	return strings.TrimSuffix(u, "/")
}

func (l *ledger) acquire(partition int, holder string) fence.Lease {
	l.t.Helper()
	lease, err := l.store.Acquire(context.Background(), partition, holder, time.Minute)
	require.NoError(l.t, err)
	return lease
}

// event is what a test publishes to LEDGER_IN.
type event struct {
	partition  int
	task       string
	holder     string
	generation int64
	version    int64
	typ        string
	payload    string
	id         string
}

func (l *ledger) msg(ev event) *nats.Msg {
	if ev.id == "" {
		ev.id = ledgertest.NewID()
	}
	return l.subj.InboundMsg(wire.Inbound{ID: ev.id, Partition: ev.partition, Task: ev.task, Holder: ev.holder,
		Generation: ev.generation, Version: ev.version, Type: ev.typ, Payload: []byte(ev.payload)})
}

func (l *ledger) publish(evs ...event) {
	l.t.Helper()
	for _, ev := range evs {
		l.publishMsg(l.msg(ev))
	}
}

func (l *ledger) publishMsg(m *nats.Msg) {
	l.t.Helper()
	_, err := l.js.PublishMsg(context.Background(), m)
	require.NoError(l.t, err)
}

// waitStream waits until stream holds at least n messages.
func (l *ledger) waitStream(stream string, n uint64) {
	l.t.Helper()
	require.Eventually(l.t, func() bool {
		s, err := l.js.Stream(context.Background(), stream)
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs >= n
	}, 20*time.Second, 10*time.Millisecond, "stream %s never held %d messages", stream, n)
}

// waitCommitted waits until task has n committed events.
func (l *ledger) waitCommitted(task string, n int) {
	l.t.Helper()
	require.Eventually(l.t, func() bool {
		return ledgertest.Count(l.t, l.db.Pool, `SELECT count(*) FROM ledger.events WHERE task_id = $1`, task) >= n
	}, 20*time.Second, 10*time.Millisecond, "task %s never had %d committed events", task, n)
}

// lastDLQSeq is LEDGER_DLQ's last sequence.
func (l *ledger) lastDLQSeq() uint64 {
	l.t.Helper()
	s, err := l.js.Stream(context.Background(), wire.StreamDLQ)
	require.NoError(l.t, err)
	info, err := s.Info(context.Background())
	require.NoError(l.t, err)
	return info.State.LastSeq
}

// inLast is LEDGER_IN's last sequence: it moves when anything is
// published to it, a replay included.
func (l *ledger) inLast() uint64 {
	l.t.Helper()
	s, err := l.js.Stream(context.Background(), wire.StreamIn)
	require.NoError(l.t, err)
	info, err := s.Info(context.Background())
	require.NoError(l.t, err)
	return info.State.LastSeq
}

// get fetches a console page; header is set on the request.
func get(t *testing.T, u string, header ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// post submits a form to the console with the given headers and cookies.
func post(t *testing.T, u string, form url.Values, cookies []*http.Cookie, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// eventually waits for a console page to contain want.
func eventually(t *testing.T, u, want string) string {
	t.Helper()
	var body string
	require.Eventually(t, func() bool {
		_, _, body = get(t, u)
		return strings.Contains(body, want)
	}, 20*time.Second, 50*time.Millisecond, "%s never showed %q; last:\n%s", u, want, &body)
	return body
}
