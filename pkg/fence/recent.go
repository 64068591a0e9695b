package fence

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TaskHead is a task's newest committed version.
type TaskHead struct {
	Task      string
	Partition int
	Version   int64
}

// sqlRecentHeads reads the task heads among the newest commits (at most $1
// of them) of the last $2 seconds.
const sqlRecentHeads = `
SELECT task_id, partition, max(version)
FROM (SELECT task_id, partition, version, committed_at FROM ledger.events
      WHERE seq > (SELECT coalesce(max(seq), 0) FROM ledger.events) - $1) e
WHERE committed_at > now() - make_interval(secs => $2)
GROUP BY task_id, partition`

// RecentHeads returns the newest version of each task committed within
// window, looking at the newest maxRows commits at most: what a JetStream
// server that lost its unsynced writes may lack.
func (s *Store) RecentHeads(ctx context.Context, window time.Duration, maxRows int) ([]TaskHead, error) {
	rows, err := s.pool.Query(ctx, sqlRecentHeads, maxRows, window.Seconds())
	if err != nil {
		return nil, fmt.Errorf("fence: recent task heads: %w", err)
	}
	heads, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TaskHead, error) {
		var h TaskHead
		return h, r.Scan(&h.Task, &h.Partition, &h.Version)
	})
	if err != nil {
		return nil, fmt.Errorf("fence: recent task heads: %w", err)
	}
	return heads, nil
}
