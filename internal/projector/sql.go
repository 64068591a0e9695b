package projector

// The projector only reads the events table.
const (
	// sqlRefetch reads the missing versions of several tasks at once: for
	// each (task, from, to) the versions from..to (to = 0: all after from),
	// in version order, at most $4 per task.
	sqlRefetch = `
SELECT e.task_id, e.partition, e.version, e.seq, e.type, e.payload::text
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(task_id, from_v, to_v)
CROSS JOIN LATERAL (
    SELECT task_id, partition, version, seq, type, payload FROM ledger.events e
    WHERE e.task_id = r.task_id AND e.version >= r.from_v AND (r.to_v = 0 OR e.version <= r.to_v)
    ORDER BY e.version LIMIT $4
) e`

	// sqlScan reads the log in seq order for a rebuild.
	sqlScan = `
SELECT task_id, partition, version, seq, type, payload::text FROM ledger.events
WHERE seq > $1 AND partition = ANY($2::int[]) ORDER BY seq LIMIT $3`

	sqlScanCount = `SELECT count(*), coalesce(max(seq), 0) FROM ledger.events WHERE partition = ANY($1::int[])`
)
