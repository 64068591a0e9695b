package fence

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Restored is what RestoreCommits did with one copy.
type Restored struct {
	Copy Committed
	// Outcome is "restored", "present" (the database holds it already) or
	// "refused" (Reason says why: the database moved on without it).
	Outcome, Reason string
}

const (
	sqlRestoreHas  = `SELECT EXISTS (SELECT 1 FROM ledger.event_ids WHERE event_id = $1) OR EXISTS (SELECT 1 FROM ledger.events WHERE seq = $2)`
	sqlRestoreHead = `SELECT version FROM ledger.heads WHERE task_id = $1 FOR UPDATE`
	sqlRestoreRow  = `
INSERT INTO ledger.events (seq, event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10)`
	sqlRestoreID      = `INSERT INTO ledger.event_ids (event_id, seq) VALUES ($1, $2)`
	sqlRestoreHeadRow = `
INSERT INTO ledger.heads (task_id, partition, version, seq, type, first_seq) VALUES ($1, $2, $3, $4, $5, $4)
ON CONFLICT (task_id) DO UPDATE SET version = excluded.version, seq = excluded.seq, type = excluded.type`
	// sqlRestoreDraw moves seq's sequence to $1 unless it is past it.
	sqlRestoreDraw = `
SELECT setval(pg_get_serial_sequence('ledger.events', 'seq'),
              greatest($1::bigint, coalesce(pg_sequence_last_value(pg_get_serial_sequence('ledger.events', 'seq')::regclass), 1)))`
	// sqlRestoreSequence moves seq's sequence past the restored rows, so
	// that no later commit draws one of their seqs.
	sqlRestoreSequence = `
SELECT setval(pg_get_serial_sequence('ledger.events', 'seq'),
              greatest((SELECT max(seq) FROM ledger.events),
                       coalesce(pg_sequence_last_value(pg_get_serial_sequence('ledger.events', 'seq')::regclass), 1)))`
)

// RestoreCommits writes back, with their original seq, version,
// generation, holder, payload and commit time, acknowledged commits the
// database forgot (a failover to a lagging standby, a restore from an
// older backup), from their LEDGER_LOG copies. It restores a copy only
// where the database has not moved on without it: its id and seq are
// free and its task's head is the version before. Everything happens in
// one transaction; nothing must commit meanwhile (the ingest commits
// nothing on such a database until it holds the acknowledged commits
// again). Run it as the schema's owner.
func (s *Store) RestoreCommits(ctx context.Context, copies []Committed) ([]Restored, error) {
	copies = slices.Clone(copies)
	slices.SortFunc(copies, func(a, b Committed) int { return cmp.Compare(a.Seq, b.Seq) })
	copies = slices.CompactFunc(copies, func(a, b Committed) bool { return a.EventID == b.EventID })
	if len(copies) == 0 {
		return nil, nil
	}
	// ledger.ensure_partitions makes partitions only past the newest seq
	// drawn (migration 00012): the sequence moves past the copies first.
	if _, err := s.pool.Exec(ctx, sqlRestoreDraw, copies[len(copies)-1].Seq); err != nil {
		return nil, fmt.Errorf("fence: restore: move the seq sequence: %w", err)
	}
	if _, _, err := s.parts.ensure(ctx, copies[len(copies)-1].Seq); err != nil {
		return nil, fmt.Errorf("fence: restore: make partitions: %w", err)
	}
	out := make([]Restored, 0, len(copies))
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		out = out[:0]
		for _, c := range copies {
			r := Restored{Copy: c, Outcome: "restored"}
			var has bool
			if err := tx.QueryRow(ctx, sqlRestoreHas, c.EventID, c.Seq).Scan(&has); err != nil {
				return err
			}
			var head int64
			err := tx.QueryRow(ctx, sqlRestoreHead, c.Task).Scan(&head)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			switch {
			case has:
				r.Outcome = "present"
			case head != c.Version-1:
				r.Outcome, r.Reason = "refused", fmt.Sprintf("the task's head is version %d, not %d", head, c.Version-1)
			default:
				if err := restoreRow(ctx, tx, c); err != nil {
					return fmt.Errorf("seq %d (%s): %w", c.Seq, c.EventID, err)
				}
			}
			out = append(out, r)
		}
		_, err := tx.Exec(ctx, sqlRestoreSequence)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fence: restore commits: %w", err)
	}
	return out, nil
}

func restoreRow(ctx context.Context, tx pgx.Tx, c Committed) error {
	payload := string(c.Payload)
	if payload == "" {
		payload = "null"
	}
	if _, err := tx.Exec(ctx, sqlRestoreRow, c.Seq, c.EventID, c.Partition, c.Task, c.Version, c.Type, payload,
		c.Holder, c.Generation, c.CommittedAt); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sqlRestoreID, c.EventID, c.Seq); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, sqlRestoreHeadRow, c.Task, c.Partition, c.Version, c.Seq, c.Type)
	return err
}
