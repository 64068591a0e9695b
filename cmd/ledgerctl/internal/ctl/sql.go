package ctl

import (
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// Every statement of the package, in one place. They only read; values are
// always parameters. Times left are computed by the database clock, the one
// that decides expiry.
const (
	// sqlClaims lists the ingests' claims on the partitions.
	sqlClaims = `
WITH now AS (SELECT clock_timestamp() AS t)
SELECT c.partition, c.owner, c.epoch, c.expires_at > now.t,
       floor(extract(epoch FROM c.expires_at - now.t) * 1000)::bigint, c.claimed_at
FROM ledger.ingest_claims c CROSS JOIN now ORDER BY c.partition`

	// sqlLeases lists the leases, all of them or the one of partition $1.
	sqlLeases = `
WITH now AS (SELECT clock_timestamp() AS t)
SELECT l.partition, l.holder, l.generation, l.expires_at, l.ttl_ms,
       l.expires_at > now.t AS valid,
       floor(extract(epoch FROM l.expires_at - now.t) * 1000)::bigint AS time_left_ms
FROM ledger.leases l CROSS JOIN now
WHERE $1::int IS NULL OR l.partition = $1
ORDER BY l.partition`

	// sqlTaskEvents is a task's committed events in version order.
	sqlTaskEvents = `
SELECT seq, event_id, partition, version, type, holder, generation, committed_at, payload::text
FROM ledger.events WHERE task_id = $1 ORDER BY version`

	// sqlTaskOwner is the principal that owns a task (migration 00013),
	// and whether it is a snapshot task (migration 00016).
	sqlTaskOwner = `SELECT coalesce(owner, ''), kind = 'snapshot' FROM ledger.heads WHERE task_id = $1`

	// sqlTaskArchived is how many of a task's first versions are archived
	// (ledgerctl archive), and the horizon: 0 when none is.
	sqlTaskArchived = `
SELECT CASE WHEN h.first_seq < z.below_seq THEN coalesce(
           (SELECT min(e.version) FROM ledger.events e
            WHERE e.task_id = h.task_id AND e.seq >= z.below_seq AND e.seq <= h.seq), h.version + 1) - 1
       ELSE 0 END, z.below_seq
FROM ledger.heads h CROSS JOIN ledger.horizon z WHERE h.task_id = $1`

	// sqlTaskRejections is a task's stale, conflicting and gap-timed-out
	// events, in the order they were rejected.
	sqlTaskRejections = `
SELECT id, event_id, partition, version, holder, generation, verdict, reason,
       coalesce(current_generation, 0), rejected_at
FROM ledger.rejections WHERE task_id = $1 ORDER BY id`
)

// schemaHint explains an error from a database without the ledger schema.
func schemaHint(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.UndefinedTable || pgErr.Code == pgerrcode.InvalidSchemaName) {
		return fmt.Errorf("%s: the ledger schema is missing (run 'ledgerctl migrate'): %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
