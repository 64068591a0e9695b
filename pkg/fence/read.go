package fence

import (
	"context"
	"fmt"

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
