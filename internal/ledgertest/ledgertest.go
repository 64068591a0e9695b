// Package ledgertest is the one kit of small helpers the project's tests
// share: a logger that is quiet unless asked, event ids, and the few
// database reads and nudges tests make of the ledger's tables (a lease
// expired, partitions made small). The
// harnesses that start things (an isolated database, an embedded NATS
// server) are dbtest and natstest.
package ledgertest

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/flowness/ledger/pkg/fence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oklog/ulid/v2"
	"github.com/stretchr/testify/require"
)

// Logger discards everything, unless LEDGER_TEST_LOG is set: then it
// writes text at debug level to stderr, to watch a test's services.
func Logger() *slog.Logger {
	if os.Getenv("LEDGER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// NewID is a fresh event id (a ULID of now).
func NewID() string { return ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String() }

// ExpireLeaseSQL makes partition $1's lease expire now, as if its TTL had
// run out, without waiting for the clock.
const ExpireLeaseSQL = `UPDATE ledger.leases SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE partition = $1`

// ExpireLease runs ExpireLeaseSQL for partition.
func ExpireLease(tb testing.TB, pool *pgxpool.Pool, partition int) {
	tb.Helper()
	_, err := pool.Exec(context.Background(), ExpireLeaseSQL, partition)
	require.NoError(tb, err)
}

// Count runs a query that returns one integer (a count) and returns it.
func Count(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	tb.Helper()
	var n int
	require.NoError(tb, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// Buffer collects what a logger or a command writes, safe for writers on
// other goroutines and a reading test at once.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// SmallPartitions remakes the partitions of an empty ledger with rows rows
// each, so that a test crosses partition boundaries after a few hundred
// events, and returns a Store with cfg made afterwards. Ten partitions are
// kept ahead, so that an append does not outrun the background making of
// the next ones (it would make them itself, burning the seqs of the
// attempt, which tests' exact counts do not allow for).
func SmallPartitions(tb testing.TB, pool *pgxpool.Pool, cfg fence.Config, rows int) *fence.Store {
	tb.Helper()
	ctx := context.Background()
	names, err := pool.Query(ctx, `SELECT name FROM ledger.event_partitions`)
	require.NoError(tb, err)
	list, err := pgx.CollectRows(names, pgx.RowTo[string])
	require.NoError(tb, err)
	for _, n := range list {
		_, err := pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{"ledger", n}.Sanitize())
		require.NoError(tb, err)
	}
	_, err = pool.Exec(ctx, `DELETE FROM ledger.event_partitions`)
	require.NoError(tb, err)
	_, err = pool.Exec(ctx, `UPDATE ledger.partitioning SET rows_per_partition = $1, partitions_ahead = 10`, rows)
	require.NoError(tb, err)
	s, err := fence.New(pool, cfg)
	require.NoError(tb, err)
	_, _, err = s.EnsurePartitions(ctx)
	require.NoError(tb, err)
	return s
}

// GzipStored is data as a gzip stream of stored (uncompressed) blocks: a
// valid framing for a reader under test (archive files, snapshots), at a
// fraction of the cost of compressing, for fuzz targets that frame every
// input.
func GzipStored(data []byte) []byte {
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.NoCompression) // a valid level
	_, _ = gz.Write(data)                                  // a bytes.Buffer does not fail
	_ = gz.Close()
	return buf.Bytes()
}
