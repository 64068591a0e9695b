package fence

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Partitions of ledger.events are made ahead of need by the appends
// themselves (migration 00006, ledger.ensure_partitions), so no operator
// step can be forgotten and stop commits. Each Store remembers where the
// partitions end; once an append commits a seq inside the last partition,
// it makes the next ones in the background, and an append that finds no
// partition for its rows makes them before it runs again.

const (
	// ensureLockTimeout bounds how long making a partition waits for the
	// lock on ledger.events: an archive's detach may hold it while it waits
	// for old transactions, and the next partition is needed only later.
	ensureLockTimeout = 2 * time.Second
	// ensureRetry is how long a failed background attempt waits before the
	// next append tries again.
	ensureRetry = 5 * time.Second
)

// partitionKeeper makes partitions of ledger.events ahead of the appends.
type partitionKeeper struct {
	pool *pgxpool.Pool

	end     atomic.Int64 // where the partitions end, as last read; 0 until read
	size    atomic.Int64 // rows per partition, as last read
	retryAt atomic.Int64 // unix nanoseconds before which no background attempt starts
	running atomic.Bool
}

// note is told the highest seq an append committed. Once it lies in the
// last partition (or the end is not known yet) the next partitions are
// made in the background; the append does not wait.
func (k *partitionKeeper) note(seq int64) {
	end, size := k.end.Load(), k.size.Load()
	if end != 0 && seq < end-size {
		return
	}
	if time.Now().UnixNano() < k.retryAt.Load() || !k.running.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer k.running.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 4*ensureLockTimeout)
		defer cancel()
		if _, _, err := k.ensure(ctx, seq); err != nil {
			k.retryAt.Store(time.Now().Add(ensureRetry).UnixNano())
		}
	}()
}

// ensure makes partitions until they reach the configured number past
// upto and past the newest seq drawn, and returns where they end and the
// rows of a partition.
func (k *partitionKeeper) ensure(ctx context.Context, upto int64) (end, size int64, err error) {
	err = pgx.BeginFunc(ctx, k.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlEnsureTimeouts, ms(ensureLockTimeout)); err != nil {
			return err
		}
		return tx.QueryRow(ctx, sqlEnsurePartitions, upto).Scan(&end, &size)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("fence: make partitions of ledger.events past seq %d: %w", upto, err)
	}
	k.size.Store(size)
	k.end.Store(end)
	return end, size, nil
}

// EnsurePartitions makes the partitions of ledger.events that the
// configuration (ledger.partitioning) asks to exist ahead of the newest seq,
// and returns where they end and how many rows one holds. Appends call it
// on their own as they near the end; operators and tests may call it after
// changing the configuration.
func (s *Store) EnsurePartitions(ctx context.Context) (end, rowsPerPartition int64, err error) {
	return s.parts.ensure(ctx, 0)
}

// isNoPartition reports whether err is PostgreSQL finding no partition of
// ledger.events for a row: the partitions ran out (the background attempts
// failed). It is a fault of the deployment, never of the events, and must
// not be traced to them as a data error.
func isNoPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.CheckViolation && pgErr.ConstraintName == "" &&
		pgErr.SchemaName == "ledger" && pgErr.TableName == "events"
}
