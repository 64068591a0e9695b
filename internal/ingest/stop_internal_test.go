package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/internal/natstest"
	"github.com/flowness/ledger/pkg/fence"
)

// Stop returns while a lane or the claims loop waits to beat: Stop waits
// for them, so it must not hold the beat lock while it does. The test holds
// the lock, lets Stop queue for it first and a beat second, then lets go:
// Stop gets the lock before the beat. Switch: Stop keeping beatMu until it
// returns (service.go) hangs here every time.
func TestStopReturnsWhileABeatWaits(t *testing.T) {
	t.Parallel()
	db, ns := dbtest.New(t), natstest.Start(t)
	store, err := fence.New(db.Pool, fence.Config{})
	require.NoError(t, err)
	s, err := New(Config{StopTimeout: 500 * time.Millisecond}, Deps{NC: ns.Conn(t), Store: store, Logger: ledgertest.Logger()})
	require.NoError(t, err)
	require.NoError(t, s.Start(context.Background()))

	s.claims.beatMu.Lock()
	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	time.Sleep(100 * time.Millisecond) // Stop queues for the lock first
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.beat() }() // a lane asks for a beat
	time.Sleep(100 * time.Millisecond)
	s.claims.beatMu.Unlock()

	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("Stop did not return while a beat waited for its lock")
	}
}
