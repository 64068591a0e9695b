package ctl_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/ctl"
	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// result is what one ledgerctl run printed and returned.
type result struct {
	code           int
	stdout, stderr string
}

// run drives ledgerctl through the entry point the binary uses.
func run(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := ctl.Run(ctx, args, &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// ok fails the test unless the run succeeded.
func (r result) ok(t *testing.T) result {
	t.Helper()
	require.Equal(t, 0, r.code, "exit status; stderr:\n%s\nstdout:\n%s", r.stderr, r.stdout)
	return r
}

// jsonLines decodes -json output, one object per line.
func (r result) jsonLines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "line %q", sc.Text())
		out = append(out, m)
	}
	return out
}

// env is one test's ledger: its own database, an embedded NATS server and,
// when asked for, an ingest service on them.
type env struct {
	t     *testing.T
	db    *dbtest.DB
	store *fence.Store
	ns    *natstest.Server
	js    jetstream.JetStream
	subj  wire.Subjects
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, db: dbtest.New(t), ns: natstest.Start(t)}
	var err error
	e.store, err = fence.New(e.db.Pool, fence.Config{})
	require.NoError(t, err)
	e.js = e.ns.JetStream(t)
	return e
}

// withIngest starts an ingest service (which also applies the streams).
func (e *env) withIngest(cfg ingest.Config) *env {
	e.t.Helper()
	svc, err := ingest.New(cfg, ingest.Deps{NC: e.ns.Conn(e.t), Store: e.store,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(e.t, err)
	require.NoError(e.t, svc.Start(context.Background()))
	e.t.Cleanup(svc.Stop)
	return e
}

// run is ledgerctl with this env's database and NATS.
func (e *env) run(args ...string) result {
	e.t.Helper()
	return run(e.t, append([]string{"-database-url", e.db.URL, "-nats-url", e.ns.URL()}, args...)...)
}

func (e *env) acquire(partition int, holder string) fence.Lease {
	e.t.Helper()
	l, err := e.store.Acquire(context.Background(), partition, holder, time.Minute)
	require.NoError(e.t, err)
	return l
}

func (e *env) expire(partition int) {
	e.t.Helper()
	ledgertest.ExpireLease(e.t, e.db.Pool, partition)
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
}

func newID() string { return ledgertest.NewID() }

func (e *env) msg(ev event) *nats.Msg {
	return e.subj.InboundMsg(wire.Inbound{ID: newID(), Partition: ev.partition, Task: ev.task, Holder: ev.holder,
		Generation: ev.generation, Version: ev.version, Type: ev.typ, Payload: []byte(ev.payload)})
}

func (e *env) publishMsg(m *nats.Msg) {
	e.t.Helper()
	_, err := e.js.PublishMsg(context.Background(), m)
	require.NoError(e.t, err)
}

func (e *env) publish(evs ...event) {
	e.t.Helper()
	for _, ev := range evs {
		e.publishMsg(e.msg(ev))
	}
}

// waitMsgs waits until stream holds at least n messages.
func (e *env) waitMsgs(stream string, n uint64) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		s, err := e.js.Stream(context.Background(), stream)
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs >= n
	}, 20*time.Second, 10*time.Millisecond, "stream %s never held %d messages", stream, n)
}

// waitCommitted waits until task has n committed events.
func (e *env) waitCommitted(task string, n int) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		var got int
		err := e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger.events WHERE task_id = $1`, task).Scan(&got)
		return err == nil && got >= n
	}, 20*time.Second, 10*time.Millisecond, "task %s never had %d committed events", task, n)
}
