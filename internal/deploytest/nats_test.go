package deploytest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// loadNATSConf parses a server configuration file of deploy/; passwords
// come from the environment TestMain set.
func loadNATSConf(t testing.TB, rel string) *server.Options {
	t.Helper()
	o, err := server.ProcessConfigFile(repoFile(t, rel))
	require.NoErrorf(t, err, "%s", rel)
	return o
}

// startAuthServer starts an embedded JetStream server with the accounts and
// users of deploy/nats/auth.conf.
func startAuthServer(t testing.TB) *natstest.Server {
	t.Helper()
	conf := loadNATSConf(t, "deploy/nats/auth.conf")
	return natstest.Start(t, natstest.WithOptions(func(o *server.Options) {
		o.Accounts, o.Users, o.Nkeys, o.NoAuthUser = conf.Accounts, conf.Users, conf.Nkeys, conf.NoAuthUser
		// The account's limits are reservations: the server must be able
		// to grant them, as a production server with its disk would.
		o.JetStreamMaxStore = 128 << 30
	}))
}

// userConn is a connection as one user of auth.conf, with the asynchronous
// errors the server sent it (permission violations arrive that way).
type userConn struct {
	*nats.Conn
	errs chan error
}

var natsUsers = map[string]string{
	"ingest":    "LEDGER_INGEST_PASSWORD",
	"projector": "LEDGER_PROJECTOR_PASSWORD",
	"worker-a":  "LEDGER_WORKER_PASSWORD",
	"worker-b":  "LEDGER_WORKER_PASSWORD",
	"reader":    "LEDGER_READER_PASSWORD",
	"operator":  "LEDGER_OPERATOR_PASSWORD",
}

func connectAs(t testing.TB, srv *natstest.Server, user string) *userConn {
	t.Helper()
	env, ok := natsUsers[user]
	require.Truef(t, ok, "no test password for NATS user %s", user)
	uc := &userConn{errs: make(chan error, 64)}
	opts := []nats.Option{nats.Name("deploytest-" + user), nats.UserInfo(user, natsPasswords[env])}
	if strings.HasPrefix(user, "worker-") {
		opts = append(opts, nats.CustomInboxPrefix(wire.InboxPrefix(user)))
	}
	nc, err := nats.Connect(srv.URL(), append(opts,
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case uc.errs <- err:
			default:
			}
		}))...)
	require.NoErrorf(t, err, "connect as %s", user)
	t.Cleanup(nc.Close)
	uc.Conn = nc
	return uc
}

func (uc *userConn) js(t testing.TB) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(uc.Conn)
	require.NoError(t, err)
	return js
}

// requireDenied waits for the server's permissions violation that names
// subject.
func (uc *userConn) requireDenied(t testing.TB, subject string) {
	t.Helper()
	_ = uc.Flush()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-uc.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
				return
			}
		case <-timeout:
			t.Fatalf("no permissions violation for %q", subject)
		}
	}
}

// requireNoErrors checks that the server reported nothing to uc.
func (uc *userConn) requireNoErrors(t testing.TB) {
	t.Helper()
	require.NoError(t, uc.Flush())
	select {
	case err := <-uc.errs:
		t.Fatalf("unexpected error from the server: %v", err)
	default:
	}
}

func TestNATSAuthorizationConfinesEachComponent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := startAuthServer(t)
	ingest, projector := connectAs(t, srv, "ingest"), connectAs(t, srv, "projector")
	workerA, reader := connectAs(t, srv, "worker-a"), connectAs(t, srv, "reader")

	// The ingest creates the streams at start.
	require.NoError(t, streams.Apply(ctx, ingest.js(t), streams.Options{}))
	// The ingest serves the lease service.
	for _, subj := range []string{"ledger.lease.acquire.*.*", "ledger.task.head"} {
		_, err := ingest.QueueSubscribe(subj, "ledger", func(m *nats.Msg) { _ = m.Respond([]byte(`{"ok":true}`)) })
		require.NoError(t, err)
	}
	ingest.requireNoErrors(t)

	t.Run("anonymous clients are refused", func(t *testing.T) {
		_, err := nats.Connect(srv.URL(), nats.NoReconnect())
		require.ErrorIs(t, err, nats.ErrAuthorization)
	})

	t.Run("worker publishes an event to LEDGER_IN", func(t *testing.T) {
		msg := nats.NewMsg("ledger.in.worker-a.1.3.t")
		msg.Header.Set(nats.MsgIdHdr, "01JD0000000000000000000001")
		msg.Data = []byte(`{"status":"running"}`)
		ack, err := workerA.js(t).PublishMsg(ctx, msg)
		require.NoError(t, err)
		require.Equal(t, "LEDGER_IN", ack.Stream)
	})

	t.Run("worker calls the lease service", func(t *testing.T) {
		for _, subj := range []string{"ledger.lease.acquire.worker-a.1", "ledger.task.head"} {
			reply, err := workerA.RequestWithContext(ctx, subj, []byte(`{}`))
			require.NoErrorf(t, err, "request %s", subj)
			require.JSONEq(t, `{"ok":true}`, string(reply.Data))
		}
	})

	t.Run("worker cannot write the log, the dead letters or receipts", func(t *testing.T) {
		for _, subj := range []string{"ledger.log.3.t", "ledger.dlq.3.t", "ledger.receipt.worker-b.1", "$KV.ledger_tasks.t",
			"ledger.in.worker-b.1.3.t", "ledger.lease.acquire.worker-b.1"} {
			require.NoError(t, workerA.Publish(subj, []byte(`{}`)))
			workerA.requireDenied(t, subj)
		}
		info, err := ingest.js(t).Stream(ctx, "LEDGER_LOG")
		require.NoError(t, err)
		require.Zero(t, info.CachedInfo().State.Msgs, "a worker's message reached LEDGER_LOG")
	})

	t.Run("worker cannot manage streams", func(t *testing.T) {
		// A denied publish gets no reply at all, so publish rather than wait
		// for a request to time out.
		for _, subj := range []string{"$JS.API.STREAM.PURGE.LEDGER_IN", "$JS.API.STREAM.DELETE.LEDGER_LOG"} {
			require.NoError(t, workerA.PublishRequest(subj, workerA.NewRespInbox(), nil))
			workerA.requireDenied(t, subj)
		}
	})

	t.Run("worker reads its own receipts and no one else's", func(t *testing.T) {
		own, err := workerA.SubscribeSync("ledger.receipt.worker-a.>")
		require.NoError(t, err)
		workerA.requireNoErrors(t)
		require.NoError(t, ingest.Publish("ledger.receipt.worker-a.1", []byte(`{"verdict":"committed"}`)))
		m, err := own.NextMsg(5 * time.Second)
		require.NoError(t, err)
		require.JSONEq(t, `{"verdict":"committed"}`, string(m.Data))

		_, err = workerA.SubscribeSync("ledger.receipt.worker-b.1")
		require.NoError(t, err)
		workerA.requireDenied(t, "ledger.receipt.worker-b.1")
	})

	t.Run("projector consumes the log and writes projections", func(t *testing.T) {
		msg := nats.NewMsg("ledger.log.3.t")
		msg.Header.Set(nats.MsgIdHdr, "01JD0000000000000000000001")
		msg.Data = []byte(`{"status":"running"}`)
		_, err := ingest.js(t).PublishMsg(ctx, msg)
		require.NoError(t, err, "the ingest writes LEDGER_LOG")

		js := projector.js(t)
		cons, err := streams.ApplyConsumer(ctx, js, "LEDGER_LOG", "projector", streams.Options{})
		require.NoError(t, err)
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		var got []jetstream.Msg
		for m := range batch.Messages() {
			got = append(got, m)
			require.NoError(t, m.DoubleAck(ctx))
		}
		require.NoError(t, batch.Error())
		require.Len(t, got, 1)

		for _, bucket := range []string{wire.BucketTasks, wire.BucketProjector} {
			kv, err := streams.ApplyBucket(ctx, js, bucket, streams.Options{})
			require.NoErrorf(t, err, "bucket %s", bucket)
			// A denied put gets no ack: do not wait for the whole test's deadline.
			putCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = kv.Put(putCtx, "t", []byte(`{"task":"t","version":1}`))
			cancel()
			require.NoErrorf(t, err, "put into bucket %s", bucket)
		}
		require.NoError(t, projector.Publish("ledger.in.worker-a.1.3.t", []byte(`{}`)))
		projector.requireDenied(t, "ledger.in.worker-a.1.3.t")
	})

	t.Run("reader watches projections and cannot write them", func(t *testing.T) {
		kv, err := reader.js(t).KeyValue(ctx, "ledger_tasks")
		require.NoError(t, err)
		e, err := kv.Get(ctx, "t")
		require.NoError(t, err)
		require.JSONEq(t, `{"task":"t","version":1}`, string(e.Value()))

		w, err := kv.Watch(ctx, "t")
		require.NoError(t, err)
		defer w.Stop() //nolint:errcheck
		select {
		case e := <-w.Updates():
			require.NotNil(t, e)
			require.Equal(t, "t", e.Key())
		case <-time.After(5 * time.Second):
			t.Fatal("watch delivered nothing")
		}
		reader.requireNoErrors(t)

		require.NoError(t, reader.Publish("$KV.ledger_tasks.t", []byte(`{}`)))
		reader.requireDenied(t, "$KV.ledger_tasks.t")
	})
}

// TestNATSClusterFiles checks deploy/nats-cluster: three nodes of one
// cluster, each routing to all three, with JetStream and the ledger's
// authorization.
func TestNATSClusterFiles(t *testing.T) {
	t.Parallel()
	var names []string
	for i := 1; i <= 3; i++ {
		o := loadNATSConf(t, fmt.Sprintf("deploy/nats-cluster/nats-%d.conf", i))
		names = append(names, o.ServerName)
		require.Equal(t, "ledger", o.Cluster.Name)
		require.True(t, o.JetStream, "JetStream enabled")
		require.NotEmpty(t, o.StoreDir)
		var routes []string
		for _, r := range o.Routes {
			routes = append(routes, r.Host)
		}
		slices.Sort(routes)
		require.Equal(t, []string{"nats-1:6222", "nats-2:6222", "nats-3:6222"}, routes, "every node routes to every node")
		require.NotEmpty(t, o.Users, "the cluster includes deploy/nats/auth.conf")
		require.Equal(t, 8222, o.HTTPPort, "monitoring for healthz")
	}
	require.Equal(t, []string{"nats-1", "nats-2", "nats-3"}, names)
}
