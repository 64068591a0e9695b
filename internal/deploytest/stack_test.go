package deploytest

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/pkg/worker"
)

// TestLeastPrivilegeStackCommitsAndProjects runs the real ingest and
// projector services, and a worker on the real SDK, each with only its own
// rights: PostgreSQL LOGIN users in ledger_ingest and ledger_projector, and
// the NATS users of deploy/nats/auth.conf. A worker's event must be
// committed, reach its receipt, and show up in the projection a read-only
// reader watches.
func TestLeastPrivilegeStackCommitsAndProjects(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	db := dbtest.New(t)
	ingestPool := openPool(t, loginUser(t, db, roleIngest))
	projectorPool := openPool(t, loginUser(t, db, roleProjector))
	srv := startAuthServer(t)

	store, err := fence.New(ingestPool, fence.Config{})
	require.NoError(t, err)
	ingestNC, projectorNC := connectAs(t, srv, "ingest"), connectAs(t, srv, "projector")
	in, err := ingest.New(ingest.Config{}, ingest.Deps{NC: ingestNC.Conn, Store: store, Logger: log})
	require.NoError(t, err)
	require.NoError(t, in.Start(ctx))
	t.Cleanup(in.Stop)

	proj, err := projector.New(projector.Config{}, projector.Deps{NC: projectorNC.Conn, Pool: projectorPool, Logger: log})
	require.NoError(t, err)
	require.NoError(t, proj.Start(ctx))
	t.Cleanup(proj.Stop)

	client, err := worker.New(connectAs(t, srv, "worker-a").Conn, worker.Config{Holder: "worker-a.1", Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	lease, err := client.Acquire(ctx, client.PartitionOf("report-7"))
	require.NoError(t, err)
	p, err := lease.Publish(ctx, "report-7", "running", []byte(`{"status":"running"}`))
	require.NoError(t, err)
	receipt, err := p.Receipt(ctx)
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, receipt.Verdict, "receipt %+v", receipt)

	// Operators find the lease service (nats micro ls / info).
	info, err := connectAs(t, srv, "operator").RequestWithContext(ctx, "$SRV.INFO.ledger", nil)
	require.NoError(t, err)
	require.Contains(t, string(info.Data), `"name":"ledger"`)

	kv, err := connectAs(t, srv, "reader").js(t).KeyValue(ctx, "ledger_tasks")
	require.NoError(t, err)
	w, err := kv.Watch(ctx, "report-7")
	require.NoError(t, err)
	defer w.Stop() //nolint:errcheck
watch:
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-ctx.Done():
			t.Fatal("the projection of report-7 did not appear")
		}
		if e == nil {
			continue // end of the initial values
		}
		var v struct {
			Version int64           `json:"version"`
			Data    json.RawMessage `json:"data"`
		}
		require.NoError(t, json.Unmarshal(e.Value(), &v))
		if v.Version == 1 {
			require.JSONEq(t, `{"status":"running"}`, string(v.Data))
			break watch
		}
	}
	// Nothing the services did on the way was refused by the server.
	ingestNC.requireNoErrors(t)
	projectorNC.requireNoErrors(t)
}
