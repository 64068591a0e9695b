package chaos

// The checker's reads of the ledger's tables (docs/contract.md §7), restricted to
// the run's tasks and partitions so that a run against a shared deployment
// reads only its own.
const (
	sqlEvents = `SELECT seq, event_id, partition, task_id, version, type, payload::text, holder, generation, committed_at
FROM ledger.events WHERE task_id = ANY($1) ORDER BY seq`

	sqlRejections = `SELECT event_id, partition, task_id, version, holder, generation, verdict, reason,
       coalesce(current_generation, 0), rejected_at
FROM ledger.rejections WHERE task_id = ANY($1) ORDER BY id`

	sqlGrants = `SELECT partition, generation, holder, granted_at
FROM ledger.lease_grants WHERE partition = ANY($1) ORDER BY partition, generation`

	// sqlHolder is the holder of a partition's lease, for picking which
	// writer to pause.
	sqlHolder = `SELECT holder FROM ledger.leases WHERE partition = $1`
)
