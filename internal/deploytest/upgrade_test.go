package deploytest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// oneAccountConf is deploy/nats/auth.conf as shipped before the accounts
// were split: every stream, service and operator in the account LEDGER.
const oneAccountConf = "testdata/auth-one-ledger-account.conf"

// An authenticated deployment upgraded from one LEDGER account to the
// split accounts, by the steps of docs/operations.md, loses nothing: the
// dead letters stay in LEDGER, which keeps its name and its store, the
// projections come back from PostgreSQL by `projector -rebuild`, the log
// copies by `ledgerctl repair` (and the ingest's own tail check, for recent
// ones), and workers go on committing with their new keys.
// Switch: name the account of LEDGER_IN and LEDGER_DLQ otherwise in the
// generator (natsauth.AccountLedger); the dead letters are gone.
func TestUpgradeFromOneLedgerAccountLosesNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := ledgertest.Logger()
	db := dbtest.New(t)
	ingestDB, projectorDB, operatorDB := loginUser(t, db, roleIngest), loginUser(t, db, roleProjector), loginUser(t, db, roleOperator)
	store, err := fence.New(openPool(t, ingestDB), fence.Config{})
	require.NoError(t, err)
	storeDir := t.TempDir()

	// Before: the old configuration, with keys of the test's making.
	oldDir := t.TempDir()
	srv := startConfServer(t, writeOneAccountConf(t, oldDir), storeDir)
	url := srv.ClientURL()
	ingestNC := dialNKey(t, url, filepath.Join(oldDir, "ingest.nk"), "_INBOX_ingest")
	in, err := ingest.New(ingest.Config{GapWindow: gapWindow}, ingest.Deps{NC: ingestNC.Conn, Store: store, Logger: log})
	require.NoError(t, err)
	require.NoError(t, in.Start(ctx))
	proj, err := projector.New(projector.Config{}, projector.Deps{NC: dialNKey(t, url, filepath.Join(oldDir, "projector.nk"), "_INBOX_projector").Conn,
		Pool: openPool(t, projectorDB), Logger: log})
	require.NoError(t, err)
	require.NoError(t, proj.Start(ctx))
	admin := dialNKey(t, url, filepath.Join(oldDir, "ledgerctl.nk"), "_INBOX_ledgerctl")
	wconn := dialNKey(t, url, filepath.Join(oldDir, "worker-worker-a.nk"), wire.InboxPrefix("worker-a"))
	client, err := worker.New(wconn.Conn, worker.Config{Holder: wire.Holder("worker-a", "1"), Logger: log})
	require.NoError(t, err)
	tasks := []string{"upgrade-0", "upgrade-1", "upgrade-2", "upgrade-3"}
	leases := map[int]*worker.Lease{}
	for _, task := range tasks {
		p := client.PartitionOf(task)
		if leases[p] == nil {
			leases[p], err = client.Acquire(ctx, p)
			require.NoError(t, err)
		}
		for v := 1; v <= 2; v++ {
			pend, err := leases[p].Publish(ctx, task, "step", []byte(fmt.Sprintf(`{"v":%d}`, v)))
			require.NoError(t, err)
			r, err := pend.Receipt(ctx)
			require.NoError(t, err)
			require.Equal(t, wire.VerdictCommitted, r.Verdict)
		}
	}
	// A dead letter: an event under a generation the worker never held.
	lease := leases[client.PartitionOf(tasks[0])]
	_, m := rawEvent(wire.Holder("worker-a", "1"), lease.Partition(), tasks[0], lease.Generation()+1000, 3, `{"stale":true}`)
	_, err = wconn.js(t).PublishMsg(ctx, m)
	require.NoError(t, err)
	waitStream(t, ctx, admin.js(t), wire.StreamDLQ, func(st jetstream.StreamState) bool { return st.Msgs > 0 })

	// The documented steps: stop the workers, let the ingest judge every
	// event, delete the log and the projector's buckets, then stop.
	require.NoError(t, client.Close())
	waitStream(t, ctx, admin.js(t), wire.StreamIn, func(st jetstream.StreamState) bool { return st.Msgs == 0 })
	for _, name := range []string{wire.StreamLog, "KV_" + wire.BucketTasks, "KV_" + wire.BucketProjector} {
		require.NoError(t, admin.js(t).DeleteStream(ctx, name))
	}
	dlq, err := admin.js(t).Stream(ctx, wire.StreamDLQ)
	require.NoError(t, err)
	letters := dlq.CachedInfo().State
	proj.Stop()
	in.Stop()
	srv.Shutdown()
	srv.WaitForShutdown()

	// After: what `ledgerctl auth static` writes now, on the same store.
	d := &authDeployment{mode: modeStatic, dir: filepath.Join(t.TempDir(), "auth"), ledgerctl: buildBinary(t, "ledgerctl")}
	runLedgerctl(t, d.ledgerctl, nil, "auth", "static", "-worker", "worker-a", "-worker", "worker-b", "-reader", "dashboards", "-out", d.dir)
	srv = startConfServer(t, filepath.Join(d.dir, "auth.conf"), storeDir)
	url = srv.ClientURL()
	in, err = ingest.New(ingest.Config{GapWindow: gapWindow}, ingest.Deps{NC: dialNKey(t, url, d.secret("ingest", "ingest"), "_INBOX_ingest").Conn,
		Store: store, Logger: log})
	require.NoError(t, err)
	require.NoError(t, in.Start(ctx))
	t.Cleanup(in.Stop)
	proj, err = projector.New(projector.Config{}, projector.Deps{NC: dialNKey(t, url, d.secret("projector", "projector"), "_INBOX_projector").Conn,
		Pool: openPool(t, projectorDB), Logger: log})
	require.NoError(t, err)
	require.NoError(t, proj.Rebuild(ctx, nil))
	require.NoError(t, proj.Start(ctx))
	t.Cleanup(proj.Stop)
	env := []string{"NATS_URL=" + url, "NATS_NKEY=" + d.secret("ledgerctl", "ledgerctl"), "DATABASE_URL=" + operatorDB}
	runLedgerctl(t, d.ledgerctl, env, "repair", "-kinds", "log", "-since", "1h", "-grace", "0s")

	admin = dialNKey(t, url, d.secret("ledgerctl", "ledgerctl"), "_INBOX_ledgerctl")
	js := admin.js(t)
	dlq, err = js.Stream(ctx, wire.StreamDLQ)
	require.NoError(t, err)
	require.Equal(t, letters.Msgs, dlq.CachedInfo().State.Msgs, "the dead letters stayed in LEDGER")
	require.Equal(t, letters.LastSeq, dlq.CachedInfo().State.LastSeq)
	logStream, err := js.Stream(ctx, wire.StreamLog)
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, wire.BucketTasks)
	require.NoError(t, err)
	for _, task := range tasks {
		m, err := logStream.GetLastMsgForSubject(ctx, wire.Subjects{}.Log(client.PartitionOf(task), task))
		require.NoError(t, err, "the log copies of %s", task)
		c, err := wire.Subjects{}.DecodeLog(m.Subject, m.Header, m.Data)
		require.NoError(t, err)
		require.EqualValues(t, 2, c.Version, "the last log copy of %s", task)
		e, err := kv.Get(ctx, task)
		require.NoError(t, err, "the projection of %s", task)
		require.Contains(t, string(e.Value()), `"version":2`)
	}
	require.EqualValues(t, 2*len(tasks), logStream.CachedInfo().State.Msgs, "every committed event has its log copy")

	// Workers go on with their new keys, in their own accounts.
	wconn = dialNKey(t, url, d.secret("worker", "worker-a"), wire.InboxPrefix("worker-a"))
	client, err = worker.New(wconn.Conn, worker.Config{Holder: wire.Holder("worker-a", "1"), Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	lease, err = client.Acquire(ctx, client.PartitionOf(tasks[0]))
	require.NoError(t, err)
	pend, err := lease.Publish(ctx, tasks[0], "step", []byte(`{"v":3}`))
	require.NoError(t, err)
	r, err := pend.Receipt(ctx)
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, r.Verdict)
	require.EqualValues(t, 3, r.Version)
}

// writeOneAccountConf writes oneAccountConf into dir with a key of the
// test's making in each user's place, and each user's seed beside it
// (<user>.nk, named in the comment above the user).
func writeOneAccountConf(t *testing.T, dir string) string {
	t.Helper()
	seedOf := regexp.MustCompile(`# .*: seed (\S+)\.nk,`)
	var out []string
	seed := ""
	for _, line := range strings.Split(readRepoFile(t, "internal/deploytest/"+oneAccountConf), "\n") {
		if m := seedOf.FindStringSubmatch(line); m != nil {
			seed = m[1]
		}
		if key, ok := strings.CutPrefix(strings.TrimSpace(line), "nkey: "); ok {
			require.NotEmpty(t, seed, "no seed named above %s", key)
			kp, err := nkeys.CreateUser()
			require.NoError(t, err)
			s, err := kp.Seed()
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, seed+".nk"), s, 0o600))
			pub, err := kp.PublicKey()
			require.NoError(t, err)
			line, seed = strings.Replace(line, key, pub, 1), ""
		}
		out = append(out, line)
	}
	path := filepath.Join(dir, "auth.conf")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(out, "\n")), 0o600))
	return path
}

// startConfServer starts a JetStream server with the accounts and users
// of a configuration file, on storeDir.
func startConfServer(t *testing.T, conf, storeDir string) *server.Server {
	t.Helper()
	o, err := server.ProcessConfigFile(conf)
	require.NoError(t, err, conf)
	o.ServerName, o.Host, o.Port, o.NoLog, o.NoSigs = "upgrade", "127.0.0.1", -1, true, true
	o.JetStream, o.StoreDir = true, storeDir
	o.JetStreamMaxMemory, o.JetStreamMaxStore = 256<<20, 128<<30
	o.HTTPPort = 0
	srv, err := server.NewServer(o)
	require.NoError(t, err)
	srv.Start()
	t.Cleanup(srv.Shutdown)
	require.True(t, srv.ReadyForConnections(10*time.Second), "the server did not start")
	return srv
}

// dialNKey connects as the user of a seed file with an inbox prefix.
func dialNKey(t *testing.T, url, seed, inbox string) *userConn {
	t.Helper()
	o := connect.Options{NATSURL: url, NATSNKey: seed, InboxPrefix: inbox, Name: "upgrade-" + inbox}
	opts, err := o.NATSOptions(nil)
	require.NoError(t, err)
	return dial(t, url, opts...)
}

// waitStream waits until a stream's state satisfies ok.
func waitStream(t *testing.T, ctx context.Context, js jetstream.JetStream, name string, ok func(jetstream.StreamState) bool) {
	t.Helper()
	for {
		st, err := js.Stream(ctx, name)
		require.NoError(t, err)
		if ok(st.CachedInfo().State) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never reached the state waited for: %+v", name, st.CachedInfo().State)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
