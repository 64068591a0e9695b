package projector

// The projector only reads the events table.
const (
	// sqlRefetch reads the missing versions of several tasks at once: for
	// each (task, from, to) the versions from..to (to = 0: all after from),
	// in version order, at most $4 per task.
	sqlRefetch = `
SELECT e.task_id, e.partition, e.version, e.seq, e.type, e.payload::text,
       coalesce((SELECT h.kind = 'snapshot' FROM ledger.heads h WHERE h.task_id = r.task_id), false)
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(task_id, from_v, to_v)
CROSS JOIN LATERAL (
    SELECT task_id, partition, version, seq, type, payload FROM ledger.events e
    WHERE e.task_id = r.task_id AND e.version >= r.from_v AND (r.to_v = 0 OR e.version <= r.to_v)
    ORDER BY e.version LIMIT $4
) e`

	// sqlStatementTimeout bounds the statements of a rebuild's
	// transaction, in milliseconds.
	sqlStatementTimeout = `SELECT set_config('statement_timeout', $1, true)`

	// sqlScan reads the log in seq order for a rebuild.
	sqlScan = `
SELECT e.task_id, e.partition, e.version, e.seq, e.type, e.payload::text, coalesce(h.kind = 'snapshot', false)
FROM ledger.events e LEFT JOIN ledger.heads h ON h.task_id = e.task_id
WHERE e.seq > $1 AND e.partition = ANY($2::int[]) ORDER BY e.seq LIMIT $3`

	// sqlSnapshotTasks picks, of the given tasks, the snapshot tasks: the
	// archive's files do not carry a task's kind.
	sqlSnapshotTasks = `SELECT task_id FROM ledger.heads WHERE task_id = ANY($1::text[]) AND kind = 'snapshot'`

	sqlScanCount = `SELECT count(*), coalesce(max(seq), 0) FROM ledger.events WHERE partition = ANY($1::int[])`

	// sqlHorizon is the archive horizon: every event below it was moved to
	// the archive's files (ledgerctl archive).
	// It also gives the first seq of the ledger's first partition.
	sqlHorizon = `SELECT below_seq, (SELECT coalesce(min(lo), 1) FROM ledger.event_partitions) FROM ledger.horizon`

	// sqlArchivedTasks picks, of the given tasks, those whose history is
	// partly archived, with the first version the hot log still holds.
	sqlArchivedTasks = `
SELECT h.task_id, coalesce((SELECT min(e.version) FROM ledger.events e
                            WHERE e.task_id = h.task_id AND e.seq >= z.below_seq AND e.seq <= h.seq), h.version + 1)
FROM ledger.heads h CROSS JOIN ledger.horizon z
WHERE h.task_id = ANY($1::text[]) AND h.first_seq < z.below_seq`
)
