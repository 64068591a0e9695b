package ingest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/connect"
	"github.com/flowness/ledger/internal/ingest"
	"github.com/flowness/ledger/internal/ledgertest"
)

// NATS restarts as the ingest starts (chaos found it: a kill -9 of the
// server within a second of the ingest's start): applying the streams
// times out, and the ingest waits for the server as it waits for the
// database, instead of exiting. Switch: Start's streams.Apply without the
// wait; Start fails.
func TestTheIngestWaitsForNATSToApplyItsStreams(t *testing.T) {
	t.Parallel()
	e := newBareEnv(t)
	nc := e.ns.Conn(t)
	e.ns.Shutdown()
	back := make(chan struct{})
	go func() {
		defer close(back)
		time.Sleep(6 * time.Second) // past a JetStream request's 5 s
		e.ns.Restart(t)
	}()
	starting := connect.Service{StartWait: 30 * time.Second, Log: ledgertest.Logger()}
	svc, err := ingest.New(ingest.Config{StopTimeout: time.Second}, ingest.Deps{NC: nc, Store: e.store,
		Logger: ledgertest.Logger(), WhileStarting: starting.WhileStarting})
	require.NoError(t, err)
	// No deadline: as in cmd/ingest, each JetStream request times out.
	require.NoError(t, svc.Start(context.Background()), "the ingest waited for NATS")
	t.Cleanup(svc.Stop)
	<-back
}
