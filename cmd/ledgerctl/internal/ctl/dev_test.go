package ctl_test

import (
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/cmd/ledgerctl/internal/ctl"
	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/pkg/wire"
)

func TestDevRunsALedgerUntilStoppedAndDropsItsDatabase(t *testing.T) {
	t.Parallel()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- ctl.Run(ctx, []string{"dev", "-json", "-nats-port", "0", "-partitions", "5",
			"-fresh-database", "-database-url", dbtest.ServerURL()}, pw, io.Discard)
		pw.Close()
	}()

	var ready ctl.DevReady
	require.NoError(t, json.NewDecoder(pr).Decode(&ready), "the first line tells where the ledger is")
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	require.Equal(t, "ledger", ready.Prefix)
	require.Equal(t, 5, ready.Partitions)
	require.Regexp(t, `^ledger_dev_[a-z0-9]{12}$`, ready.Database)

	nc, err := nats.Connect(ready.NATSURL, nats.CustomInboxPrefix("_INBOX.reports"))
	require.NoError(t, err)
	defer nc.Close()
	m, err := nc.Request("ledger.lease.acquire.reports.dev-1", []byte(`{"partition":4}`), 5*time.Second)
	require.NoError(t, err)
	var l wire.LeaseReply
	require.NoError(t, json.Unmarshal(m.Data, &l), string(m.Data))
	require.EqualValues(t, 1, l.Generation, "the lease service answers on the printed URL")
	m, err = nc.Request("ledger.lease.get", []byte(`{"partition":4}`), 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(m.Data, &l), string(m.Data))
	require.Equal(t, 5, l.Partitions, "the deployment has the partitions asked for")

	stop()
	select {
	case code := <-done:
		require.Equal(t, 0, code, "a stop signal is a clean exit")
	case <-time.After(30 * time.Second):
		t.Fatal("dev did not stop when its context ended")
	}
	admin, err := pgx.Connect(context.Background(), dbtest.ServerURL())
	require.NoError(t, err)
	defer admin.Close(context.Background())
	var n int
	require.NoError(t, admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_database WHERE datname = $1`, ready.Database).Scan(&n))
	require.Zero(t, n, "the fresh database is dropped on exit")
}

func TestDevRefusesNonsense(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"dev", "-nats-port", "70000"},
		{"dev", "-partitions", "0"},
		{"dev", "-fresh-database", "-database-url", ""},
		{"dev", "extra"},
	} {
		r := run(t, args...)
		require.Equal(t, 2, r.code, "%v: a usage error; stderr %s", args, r.stderr)
	}
}
