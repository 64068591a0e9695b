package ingest_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/pkg/wire"
)

// An ingest counts on /metrics the appends it sent in one round trip and
// the ones whose prediction missed: a worker's next version is predicted,
// a zombie's is not what it predicted.
func TestFastAppendsAreCounted(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	reg := prometheus.NewRegistry()
	svc, err := ingest.New(ingest.Config{Lanes: 1},
		ingest.Deps{NC: e.ns.Conn(t), Store: e.store, Logger: ledgertest.Logger(), Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	rc := e.receipts("worker-a.1")
	l := e.acquire(4, "worker-a.1", 120000)
	counts := func() (fast, missed float64) {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			switch f.GetName() {
			case "ledger_ingest_fast_appends_total":
				fast = f.GetMetric()[0].GetCounter().GetValue()
			case "ledger_ingest_fast_append_misses_total":
				missed = f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return fast, missed
	}

	// Version 1 is read first (nothing cached); version 2 is predicted.
	for v := int64(1); v <= 2; v++ {
		x := event{id: newID(), partition: 4, task: "counted", holder: "worker-a.1", generation: l.Generation,
			version: v, typ: "step", payload: `{}`}
		e.publish(x)
		require.Equal(t, wire.VerdictCommitted, receiptFor(t, rc, x.id).Verdict)
	}
	fast, missed := counts()
	require.Equal(t, 1.0, fast, "version 2 went in one round trip")
	require.Zero(t, missed)

	// The lease expires and another holder takes it: worker-a.1's version 3
	// is predicted from the lease the ingest last read, and misses.
	ledgertest.ExpireLease(t, e.db.Pool, 4)
	_, err = e.store.TakeOver(context.Background(), 4, "worker-b.1", l.Generation, time.Minute)
	require.NoError(t, err)
	late := event{id: newID(), partition: 4, task: "counted", holder: "worker-a.1", generation: l.Generation,
		version: 3, typ: "step", payload: `{}`}
	e.publish(late)
	require.Equal(t, wire.VerdictStale, receiptFor(t, rc, late.id).Verdict)
	fast, missed = counts()
	require.Equal(t, 2.0, fast)
	require.Equal(t, 1.0, missed, "the zombie's batch was decided again from the database")
}
