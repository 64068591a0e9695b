package chaos

// The checker's reads of the ledger's tables (docs/contract.md §7), restricted to
// the run's tasks and partitions so that a run against a shared deployment
// reads only its own.
const (
	sqlEvents = `SELECT seq, event_id, partition, task_id, version, type, payload::text, holder, generation, committed_at,
       coalesce(would_reject, '')
FROM ledger.events WHERE task_id = ANY($1) ORDER BY seq`

	// sqlObserving lists the run's partitions in the observe fence mode
	// (docs/contract.md §13).
	sqlObserving = `SELECT partition FROM ledger.fence_modes WHERE partition = ANY($1) AND mode = 'observe'`

	sqlRejections = `SELECT event_id, partition, task_id, version, holder, generation, verdict, reason,
       coalesce(current_generation, 0), rejected_at
FROM ledger.rejections WHERE task_id = ANY($1) ORDER BY id`

	sqlGrants = `SELECT partition, generation, holder, granted_at
FROM ledger.lease_grants WHERE partition = ANY($1) ORDER BY partition, generation`

	// sqlHolder is the holder of a partition's lease, for picking which
	// writer to pause.
	sqlHolder = `SELECT holder FROM ledger.leases WHERE partition = $1`

	// sqlFailoverLease is a partition's lease and the newest event of the
	// ledger: a failover measurement's ledger holds one writers' partition,
	// so the newest event is that partition's.
	sqlFailoverLease = `SELECT l.holder, l.generation, l.expires_at, l.expires_at > clock_timestamp(),
       coalesce(e.seq, 0), coalesce(e.generation, 0)
FROM ledger.leases l LEFT JOIN LATERAL (SELECT seq, generation FROM ledger.events ORDER BY seq DESC LIMIT 1) e ON true
WHERE l.partition = $1`

	// sqlFirstCommitAfter is the first event after seq $2 of a generation
	// of partition $1 later than $3, and the grant of its generation: a
	// standby's first commit after a takeover. seq keeps it to an index
	// range scan, however long the run.
	sqlFirstCommitAfter = `SELECT e.holder, e.generation, e.committed_at, g.granted_at
FROM ledger.events e JOIN ledger.lease_grants g ON g.partition = e.partition AND g.generation = e.generation
WHERE e.seq > $2 AND e.partition = $1 AND e.generation > $3
ORDER BY e.seq LIMIT 1`

	// sqlGrantHolder is who was granted a generation.
	sqlGrantHolder = `SELECT holder FROM ledger.lease_grants WHERE partition = $1 AND generation = $2`
)
