package fence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/internal/dbtest"
	"github.com/flowness/ledger/internal/ledgertest"
	"github.com/flowness/ledger/pkg/fence"
)

// newStore gives the test its own migrated database and a Store on it.
func newStore(t testing.TB, cfg fence.Config) (*fence.Store, *dbtest.DB) {
	t.Helper()
	db := dbtest.New(t)
	s, err := fence.New(db.Pool, cfg)
	require.NoError(t, err)
	return s, db
}

// expire makes partition's lease expire now, as if its TTL had run out,
// without waiting for the clock.
func expire(t testing.TB, db *dbtest.DB, partition int) {
	ledgertest.ExpireLease(t, db.Pool, partition)
}

func newID() string { return ledgertest.NewID() }

// ev builds an event of lease l for task at version with a small payload.
func ev(l fence.Lease, task string, version int64, typ string) fence.Event {
	return fence.Event{
		ID: newID(), Partition: l.Partition, Task: task, Version: version, Type: typ,
		Payload: []byte(fmt.Sprintf(`{"v":%d,"by":%q}`, version, l.Holder)),
		Holder:  l.Holder, Generation: l.Generation,
	}
}

func appendOne(t testing.TB, s *fence.Store, e fence.Event) fence.Result {
	t.Helper()
	res, err := s.Append(context.Background(), []fence.Event{e})
	require.NoError(t, err)
	require.Len(t, res, 1)
	return res[0]
}

func countRows(t testing.TB, db *dbtest.DB, sql string, args ...any) int {
	t.Helper()
	return ledgertest.Count(t, db.Pool, sql, args...)
}

// waitDoneOrBlocked waits until done is closed or a session of db waits for
// a lock (pg_stat_activity), and reports which: true if a lock wait was
// seen first. It fails the test after 20 s of neither.
func waitDoneOrBlocked(t testing.TB, db *dbtest.DB, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return false
		default:
		}
		if countRows(t, db, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`, db.Name) > 0 {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("neither finished nor waited for a lock within 20 s")
	return false
}

// smallPartitions is ledgertest.SmallPartitions on the test's database.
func smallPartitions(t testing.TB, db *dbtest.DB, cfg fence.Config, rows int) *fence.Store {
	t.Helper()
	return ledgertest.SmallPartitions(t, db.Pool, cfg, rows)
}
