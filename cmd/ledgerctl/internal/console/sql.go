package console

// The console's own statements, beside the ones it reuses from ledgerctl
// (leases, a task's events and rejections). They only read; values are
// always parameters; times are the database's clock, the one that decides
// leases and stamps commits.
const (
	// sqlTakeovers counts each partition's takeovers of the last hour (a
	// grant of generation 2 and above, as ledger_lease_takeovers_total
	// counts them) and tells how long ago the last one was, in ms.
	sqlTakeovers = `
SELECT partition, count(*),
       floor(extract(epoch FROM clock_timestamp() - max(granted_at)) * 1000)::bigint
FROM ledger.lease_grants
WHERE generation >= 2 AND granted_at > clock_timestamp() - interval '1 hour'
GROUP BY partition`

	// sqlRecentTakeovers lists the newest takeovers of the last hour, at most
	// $1, with the holder each replaced.
	sqlRecentTakeovers = `
SELECT g.partition, g.generation, g.holder, coalesce(p.holder, ''),
       floor(extract(epoch FROM clock_timestamp() - g.granted_at) * 1000)::bigint
FROM ledger.lease_grants g
LEFT JOIN ledger.lease_grants p ON p.partition = g.partition AND p.generation = g.generation - 1
WHERE g.generation >= 2 AND g.granted_at > clock_timestamp() - interval '1 hour'
ORDER BY g.granted_at DESC, g.partition
LIMIT $1`

	// sqlHead is the newest committed position and the database's clock.
	sqlHead = `SELECT coalesce(max(seq), 0), clock_timestamp() FROM ledger.events`

	// sqlCommitsPerSecond counts commits per second of committed_at, from
	// $2 on, among the events after seq $1. Sequences are drawn at insert
	// and transactions commit out of order, so $1 is a position seen well
	// before $2: every event stamped at $2 or later lies above it.
	sqlCommitsPerSecond = `
SELECT floor(extract(epoch FROM committed_at))::bigint, count(*)
FROM ledger.events
WHERE seq > $1 AND committed_at >= $2
GROUP BY 1`

	// sqlLastCommits is each partition's newest commit after seq $1.
	sqlLastCommits = `
SELECT DISTINCT ON (partition) partition, seq, task_id, version, committed_at
FROM ledger.events
WHERE seq > $1
ORDER BY partition, seq DESC`
)
