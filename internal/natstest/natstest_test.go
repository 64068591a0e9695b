package natstest_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/natstest"
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func createStream(t *testing.T, js jetstream.JetStream, name string, replicas int) jetstream.Stream {
	t.Helper()
	st, err := js.CreateStream(testContext(t), jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{strings.ToLower(name) + ".>"},
		Storage:  jetstream.FileStorage,
		Replicas: replicas,
	})
	require.NoError(t, err)
	return st
}

// readAll returns the payloads of messages 1..LastSeq of the stream.
func readAll(t *testing.T, st jetstream.Stream) []string {
	t.Helper()
	ctx := testContext(t)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	var out []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(t, err, "get seq %d", seq)
		out = append(out, string(m.Data))
	}
	return out
}

func TestStartPublishToStream(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)

	u, err := url.Parse(srv.URL())
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", u.Hostname())
	require.NotEqual(t, "4222", u.Port(), "must not use the default port")
	require.True(t, srv.Server().JetStreamEnabled())
	require.DirExists(t, srv.StoreDir())

	js := srv.JetStream(t)
	st := createStream(t, js, "EVENTS", 1)
	ctx := testContext(t)
	for i := 1; i <= 10; i++ {
		ack, err := js.Publish(ctx, "events.created", fmt.Appendf(nil, "e%d", i))
		require.NoError(t, err)
		require.Equal(t, "EVENTS", ack.Stream)
		require.Equal(t, uint64(i), ack.Sequence)
	}
	got := readAll(t, st)
	require.Len(t, got, 10)
	require.Equal(t, "e1", got[0])
	require.Equal(t, "e10", got[9])
}

func TestRestartKeepsStreamMessages(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	urlBefore := srv.URL()

	// A connection opened before the restart must survive it.
	nc := srv.Conn(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	createStream(t, js, "LEDGER", 1)
	ctx := testContext(t)
	for i := 1; i <= 5; i++ {
		_, err := js.Publish(ctx, "ledger.tx", fmt.Appendf(nil, "tx%d", i))
		require.NoError(t, err)
	}

	reconnected := make(chan struct{}, 1)
	nc.SetReconnectHandler(func(*nats.Conn) {
		select {
		case reconnected <- struct{}{}:
		default:
		}
	})

	before := srv.Server()
	srv.Restart(t)
	require.NotSame(t, before, srv.Server())
	require.False(t, before.Running())
	require.Equal(t, urlBefore, srv.URL(), "restart keeps the client port")

	// Fresh connection: data is back from disk.
	st, err := srv.JetStream(t).Stream(ctx, "LEDGER")
	require.NoError(t, err)
	require.Equal(t, []string{"tx1", "tx2", "tx3", "tx4", "tx5"}, readAll(t, st))

	// The old connection reconnects and keeps publishing.
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("old connection did not reconnect")
	}
	ack, err := js.Publish(ctx, "ledger.tx", []byte("tx6"))
	require.NoError(t, err)
	require.Equal(t, uint64(6), ack.Sequence)

	// Shutdown + Restart works as well (a broker that was down for a while).
	srv.Shutdown()
	require.False(t, srv.Server().Running())
	srv.Restart(t)
	require.Len(t, readAll(t, st), 6)
}

func TestWithUserPassword(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.WithUserPassword("ledger", "s3cret"))

	_, err := nats.Connect(srv.URL(), nats.MaxReconnects(0))
	require.Error(t, err)
	require.True(t, errors.Is(err, nats.ErrAuthorization), "got %v", err)

	_, err = nats.Connect(srv.URL(), nats.UserInfo("ledger", "wrong"), nats.MaxReconnects(0))
	require.ErrorIs(t, err, nats.ErrAuthorization)

	// Conn and JetStream authenticate on their own.
	js := srv.JetStream(t)
	createStream(t, js, "AUTH", 1)
	_, err = js.Publish(testContext(t), "auth.x", []byte("ok"))
	require.NoError(t, err)
}

func TestWithMaxPayload(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.WithMaxPayload(1024))
	nc := srv.Conn(t)
	require.Equal(t, int64(1024), nc.MaxPayload())
	require.ErrorIs(t, nc.Publish("x", make([]byte, 1025)), nats.ErrMaxPayload)
	require.NoError(t, nc.Publish("x", make([]byte, 1024)))
}

func TestWithOptions(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, natstest.WithOptions(func(o *server.Options) {
		o.JetStreamMaxStore = 64 << 20
	}))
	require.Equal(t, int64(64<<20), srv.Server().JetStreamConfig().MaxStore)
}

// logTB captures t.Log output.
type logTB struct {
	testing.TB
	mu    sync.Mutex
	lines []string
}

func (l *logTB) Log(args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprint(args...))
}

func (l *logTB) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func TestWithLogging(t *testing.T) {
	t.Parallel()

	quiet := &logTB{TB: t}
	natstest.Start(quiet)
	require.Empty(t, quiet.text(), "no logging by default")

	loud := &logTB{TB: t}
	natstest.Start(loud, natstest.WithLogging())
	require.Contains(t, loud.text(), "Starting nats-server")
	require.Contains(t, loud.text(), "Starting JetStream")
}
