package fence

import (
	"context"
	"fmt"
)

// sqlKnowsSeq reads whether the database holds the committed seq $1 (in the
// hot log, or below the archive horizon), and its newest seq.
const sqlKnowsSeq = `
SELECT EXISTS (SELECT 1 FROM ledger.events WHERE seq = $1) OR $1 < (SELECT below_seq FROM ledger.horizon),
       coalesce((SELECT max(seq) FROM ledger.events), 0)`

// KnowsSeq reports whether the database holds the commit at seq, which the
// ledger acknowledged (its LEDGER_LOG copy is stored), and the newest seq
// it holds. A database that does not has forgotten acknowledged commits: a
// failover to a lagging standby, a restore from an older backup.
func (s *Store) KnowsSeq(ctx context.Context, seq int64) (known bool, newest int64, err error) {
	if err := s.pool.QueryRow(ctx, sqlKnowsSeq, seq).Scan(&known, &newest); err != nil {
		return false, 0, fmt.Errorf("fence: look up committed seq %d: %w", seq, err)
	}
	return known, newest, nil
}

// Connections is how many connections the store's pool has opened so far:
// a caller that checks the database after every reconnect compares it.
func (s *Store) Connections() int64 { return s.pool.Stat().NewConnsCount() }

// sqlUnknownSeqs lists which of the committed seqs $1 the database holds
// neither in the hot log nor below the archive horizon, and its newest seq.
const sqlUnknownSeqs = `
SELECT coalesce(array_agg(s ORDER BY s) FILTER (
         WHERE NOT EXISTS (SELECT 1 FROM ledger.events e WHERE e.seq = s)
           AND s >= (SELECT below_seq FROM ledger.horizon)), '{}'),
       coalesce((SELECT max(seq) FROM ledger.events), 0)
FROM unnest($1::bigint[]) AS s`

// UnknownSeqs reports which of seqs, committed seqs the ledger acknowledged,
// the database does not hold, and the newest seq it holds. Any at all
// means the database has forgotten acknowledged commits.
func (s *Store) UnknownSeqs(ctx context.Context, seqs []int64) (unknown []int64, newest int64, err error) {
	if err := s.pool.QueryRow(ctx, sqlUnknownSeqs, seqs).Scan(&unknown, &newest); err != nil {
		return nil, 0, fmt.Errorf("fence: look up %d committed seqs: %w", len(seqs), err)
	}
	return unknown, newest, nil
}
