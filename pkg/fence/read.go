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
	if err != nil {
		return nil, fmt.Errorf("fence: events of task %s between versions %d and %d: %w", task, after, before, err)
	}
	var out []Committed
	var c Committed
	var payload string
	_, err = pgx.ForEachRow(rows, []any{&c.Seq, &c.EventID, &c.Partition, &c.Task, &c.Version, &c.Type, &payload,
		&c.Holder, &c.Generation, &c.CommittedAt, &c.Snapshot}, func() error {
		c.Payload = []byte(payload)
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fence: events of task %s between versions %d and %d: %w", task, after, before, err)
	}
	return out, nil
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
	if err != nil {
		return nil, fmt.Errorf("fence: events of partition %d between seqs %d and %d: %w", partition, after, before, err)
	}
	var out []Committed
	var c Committed
	var payload string
	var wouldReject *string
	_, err = pgx.ForEachRow(rows, []any{&c.Seq, &c.EventID, &c.Partition, &c.Task, &c.Version, &c.Type, &payload,
		&c.Holder, &c.Generation, &c.CommittedAt, &c.Snapshot, &wouldReject}, func() error {
		c.Payload = []byte(payload)
		c.WouldReject = ""
		if wouldReject != nil {
			c.WouldReject = *wouldReject
		}
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fence: events of partition %d between seqs %d and %d: %w", partition, after, before, err)
	}
	return out, nil
}
