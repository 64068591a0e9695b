package fence

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Between returns the committed events of task with after < version <
// before, in version order: the copies a reader (or the ingest keeping
// LEDGER_LOG in order) lacks. Payloads are PostgreSQL's rendering of the
// stored jsonb.
func (s *Store) Between(ctx context.Context, task string, after, before int64) ([]Committed, error) {
	rows, err := s.pool.Query(ctx, sqlCommittedBetween, task, after, before)
	out, err := collectCommitted(rows, err, false)
	if err != nil {
		return nil, fmt.Errorf("fence: events of task %s between versions %d and %d: %w", task, after, before, err)
	}
	return out, nil
}

// collectCommitted reads the rows of a query of committed events: seq,
// event_id, partition, task_id, version, type, payload (as text), holder,
// generation, committed_at, whether the task is a snapshot task, and with
// wouldReject the would_reject column. err is the query's.
func collectCommitted(rows pgx.Rows, err error, wouldReject bool) ([]Committed, error) {
	if err != nil {
		return nil, err
	}
	var out []Committed
	var c Committed
	var payload string
	var reject *string
	scan := []any{&c.Seq, &c.EventID, &c.Partition, &c.Task, &c.Version, &c.Type, &payload,
		&c.Holder, &c.Generation, &c.CommittedAt, &c.Snapshot}
	if wouldReject {
		scan = append(scan, &reject)
	}
	_, err = pgx.ForEachRow(rows, scan, func() error {
		c.Payload = []byte(payload)
		c.WouldReject = ""
		if reject != nil {
			c.WouldReject = *reject
		}
		out = append(out, c)
		return nil
	})
	return out, err
}

// PartitionBetween returns partition's committed events with after < seq <
// before, oldest first, looking at the ledger's newest maxRows commits at
// most; with after 0, only those committed within window too. It is what
// an ingest writing LEDGER_LOG in batches publishes before its own commits
// when it starts a partition's chain: after is the highest seq the
// partition's last batch holds (0 if there is none), before the lowest of
// its own commits.
//
// The scan runs over seq, the log's order, not an index of partitions: it
// reads every partition's commits above after, so the bounds keep it short.
func (s *Store) PartitionBetween(ctx context.Context, partition int, after, before int64, window time.Duration,
	maxRows int) ([]Committed, error) {
	rows, err := s.pool.Query(ctx, sqlPartitionBetween, partition, after, before, maxRows, window.Seconds())
	out, err := collectCommitted(rows, err, true)
	if err != nil {
		return nil, fmt.Errorf("fence: events of partition %d between seqs %d and %d: %w", partition, after, before, err)
	}
	return out, nil
}
