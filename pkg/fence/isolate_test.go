package fence_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/faultproxy"
	"github.com/flowness/ledger/pkg/fence"
	"github.com/flowness/ledger/pkg/wire"
)

// A non-transient error that one event's row causes (here a trigger in the
// test's own database raising program_limit_exceeded, as rendering a huge
// number did) makes that event invalid; the rest of the batch commits, and
// the append returns no error for the ingest to retry forever.
//
// As the ingest's database role, the database's own fence (migration 00012)
// refuses the search's probes, which move no head, after PostgreSQL took
// their rows: the search tells the two apart and still finds the event.
func TestDataErrorOfOneEventMakesItInvalidAndCommitsTheRest(t *testing.T) {
	t.Parallel()
	for _, role := range []string{"owner", "ingest"} {
		t.Run("as the "+role, func(t *testing.T) {
			t.Parallel()
			dataErrorOfOneEvent(t, role == "ingest")
		})
	}
}

func dataErrorOfOneEvent(t *testing.T, asIngest bool) {
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
CREATE FUNCTION ledger.test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.payload ? 'poison' THEN
        RAISE EXCEPTION 'test: this payload is too much' USING ERRCODE = 'program_limit_exceeded';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_poison BEFORE INSERT ON ledger.events FOR EACH ROW EXECUTE FUNCTION ledger.test_poison();`)
	require.NoError(t, err)
	if asIngest {
		s, err = fence.New(ingestPool(t, db), fence.Config{})
		require.NoError(t, err)
	}
	l, err := s.Acquire(ctx, 0, "worker-a.1", longTTL)
	require.NoError(t, err)

	poison := ev(l, "b", 1, "x")
	poison.Payload = []byte(`{"poison":true}`)
	batch := []fence.Event{ev(l, "a", 1, "x"), poison, ev(l, "a", 2, "x"), ev(l, "c", 1, "x"), ev(l, "b", 2, "x")}
	for k := range 11 { // enough that bisection has to split
		batch = append(batch, ev(l, "d", int64(k+1), "x"))
	}
	res, err := s.Append(ctx, batch)
	require.NoError(t, err, "a data error of one event must not fail the batch")
	require.Equal(t, wire.VerdictInvalid, res[1].Verdict)
	require.Equal(t, wire.ReasonBadPayload, res[1].Reason)
	require.Contains(t, res[1].Detail, "54000")
	require.Contains(t, res[1].Detail, "this payload is too much")
	require.Equal(t, fence.NotYet, res[4].Verdict, "b's version 2 waits for a version 1 that was refused")
	for k, r := range res {
		if k != 1 && k != 4 {
			require.Equal(t, wire.VerdictCommitted, r.Verdict, "event %d", k)
		}
	}
	require.Equal(t, len(batch)-2, countRows(t, db, `SELECT count(*) FROM ledger.events`))
}

// A connection that goes silent mid-append, its transaction holding the
// lease row locked, does not keep a takeover waiting: the server ends the
// idle transaction after IdleInTransactionTimeout, the takeover proceeds,
// and the silent append gets an error, never a verdict.
func TestSilentConnectionDoesNotHoldTheLeaseLocked(t *testing.T) {
	t.Parallel()
	const idle = 500 * time.Millisecond
	cfg := fence.Config{IdleInTransactionTimeout: idle}
	s, db := newStore(t, cfg)
	ctx := context.Background()
	pc, err := pgconn.ParseConfig(db.URL)
	require.NoError(t, err)
	proxy := faultproxy.Start(t, net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))))
	zombie, err := fence.New(db.PoolVia(t, proxy.Addr()), cfg)
	require.NoError(t, err)
	// Should the test fail, the silent append must still end before its
	// pool closes. (Cut also ends the cancel request pgx sends for a broken
	// connection, which the silent proxy would hold for 15 s.)
	actx, acancel := context.WithCancel(ctx)
	t.Cleanup(func() { acancel(); proxy.Cut() })

	l, err := s.Acquire(ctx, 2, "worker-a.1", longTTL)
	require.NoError(t, err)
	silenced := make(chan struct{})
	half := fence.BeforeWrite(zombie, func() {
		proxy.Silence() // the lease row is locked; the insert and COMMIT go nowhere
		close(silenced)
	})
	appendErr := make(chan error, 1)
	go func() {
		_, err := half.Append(actx, []fence.Event{ev(l, "t", 1, "x")})
		appendErr <- err
	}()
	<-silenced
	expire(t, db, 2)

	tctx, cancel := context.WithTimeout(ctx, 10*idle)
	defer cancel()
	b, err := s.Acquire(tctx, 2, "worker-b.1", longTTL)
	require.NoError(t, err, "the takeover waited on a silent connection's lock for 10x the idle timeout")
	require.Equal(t, l.Generation+1, b.Generation)
	select {
	case err := <-appendErr:
		require.Error(t, err, "the silent append must not report a verdict")
	case <-time.After(10 * idle):
		t.Fatal("the silent append did not return after its session was ended")
	}
	require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.events`))
}

// A connection that goes silent, dropped by something in between that
// neither answers nor resets it, would hold an append (and the ingest lane
// waiting for it) for ever: the database never sees the statements, so its
// own timeouts never start. The attempt gives up at AttemptTimeout with a
// transient error, and the next append, on a fresh connection, commits.
func TestAppendOnASilentConnectionGivesUpAndTheNextCommits(t *testing.T) {
	t.Parallel()
	const attempt = time.Second
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	pc, err := pgconn.ParseConfig(db.URL)
	require.NoError(t, err)
	proxy := faultproxy.Start(t, net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))))
	viaProxy, err := fence.New(db.PoolVia(t, proxy.Addr()), fence.Config{AttemptTimeout: attempt})
	require.NoError(t, err)
	actx, acancel := context.WithCancel(ctx)
	t.Cleanup(func() { acancel(); proxy.Cut() })

	l, err := s.Acquire(ctx, 3, "worker-a.1", longTTL)
	require.NoError(t, err)
	// A connection is open first: the silence falls mid-session, where no
	// connect timeout applies. The partitions' end is read first, so no
	// background partition check takes that connection away from the
	// silent append and makes it connect afresh.
	_, _, err = viaProxy.EnsurePartitions(ctx)
	require.NoError(t, err)
	_, err = viaProxy.Append(ctx, []fence.Event{ev(l, "warm", 1, "x")})
	require.NoError(t, err)
	e := ev(l, "silent", 1, "x")
	proxy.Silence()
	appendErr := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := viaProxy.Append(actx, []fence.Event{e})
		appendErr <- err
	}()
	select {
	case err := <-appendErr:
		require.ErrorIs(t, err, fence.ErrNoAnswer)
		require.True(t, fence.IsTransient(err), "the caller retries: %v", err)
		require.Less(t, time.Since(start), 5*attempt)
	case <-time.After(10 * attempt):
		t.Fatal("the append waited on a silent connection for 10x its attempt timeout")
	}

	proxy.Restore()
	res, err := viaProxy.Append(ctx, []fence.Event{e})
	require.NoError(t, err)
	require.Equal(t, wire.VerdictCommitted, res[0].Verdict)
	require.Equal(t, 2, countRows(t, db, `SELECT count(*) FROM ledger.events`))
}

// A silence that falls before the pool has a connection ends in the
// connect timeout of a fresh connection, not the attempt's: that too is the
// database not answering, never a verdict or a fault of the batch.
func TestAppendWhoseConnectGetsNoAnswerGivesUp(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, fence.Config{})
	ctx := context.Background()
	pc, err := pgconn.ParseConfig(db.URL)
	require.NoError(t, err)
	proxy := faultproxy.Start(t, net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))))
	t.Cleanup(proxy.Cut)
	// The pool's connect timeout (1 s) ends well before the attempt's.
	viaProxy, err := fence.New(db.PoolVia(t, proxy.Addr()), fence.Config{AttemptTimeout: 30 * time.Second})
	require.NoError(t, err)
	l, err := s.Acquire(ctx, 3, "worker-a.1", longTTL)
	require.NoError(t, err)

	proxy.Silence()
	_, err = viaProxy.Append(ctx, []fence.Event{ev(l, "t", 1, "x")})
	require.ErrorIs(t, err, fence.ErrNoAnswer)
	require.True(t, fence.IsTransient(err), "the caller retries: %v", err)
	require.Equal(t, 0, countRows(t, db, `SELECT count(*) FROM ledger.events`))
}
