package fence

import (
	"fmt"
	"strings"
)

// Every statement of the package, in one place. Values are always
// parameters; batches travel as arrays and are expanded with unnest.

const (
	// sqlLeaseInsertFirst grants generation 1 on a partition never leased,
	// or the generation floor $5 when the ledger knows of higher grants.
	sqlLeaseInsertFirst = `
WITH ins AS (
    INSERT INTO ledger.leases (partition, holder, generation, expires_at, ttl_ms, request_id)
    VALUES ($1, $2, greatest(1, $5::bigint), clock_timestamp() + $3::bigint * interval '1 millisecond', $3, $4)
    ON CONFLICT (partition) DO NOTHING
    RETURNING partition, holder, generation, expires_at, ttl_ms, request_id
), grant_row AS (
    INSERT INTO ledger.lease_grants (partition, generation, holder, granted_at, request_id)
    SELECT partition, generation, holder, clock_timestamp(), request_id FROM ins
)
SELECT holder, generation, expires_at, ttl_ms, true FROM ins`

	// sqlLeaseLock reads a lease under the row lock a takeover needs. It waits
	// for every append that holds the row (FOR KEY SHARE, or FOR UPDATE), and
	// expiry is judged by the clock after the lock is granted.
	sqlLeaseLock = `
SELECT holder, generation, expires_at, ttl_ms, expires_at > clock_timestamp(), coalesce(request_id, '')
FROM ledger.leases WHERE partition = $1 FOR UPDATE`

	// sqlLeaseCAS is the compare-and-swap of a takeover: it replaces the lease
	// only if the generation is still the observed one and the lease has
	// expired (or is the caller's own), and records the grant. The new
	// generation is above the floor $6 too.
	sqlLeaseCAS = `
WITH up AS (
    UPDATE ledger.leases
    SET holder = $2, generation = greatest(generation + 1, $6::bigint),
        expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond', ttl_ms = $3,
        request_id = $5
    WHERE partition = $1 AND generation = $4
      AND (expires_at <= clock_timestamp() OR holder = $2)
    RETURNING partition, holder, generation, expires_at, ttl_ms, request_id
), grant_row AS (
    INSERT INTO ledger.lease_grants (partition, generation, holder, granted_at, request_id)
    SELECT partition, generation, holder, clock_timestamp(), request_id FROM up
)
SELECT holder, generation, expires_at, ttl_ms, true FROM up`

	sqlLeaseRenew = `
UPDATE ledger.leases
SET expires_at = clock_timestamp() + coalesce($4::bigint, ttl_ms) * interval '1 millisecond',
    ttl_ms = coalesce($4::bigint, ttl_ms)
WHERE partition = $1 AND holder = $2 AND generation = $3 AND expires_at > clock_timestamp()
RETURNING holder, generation, expires_at, ttl_ms, true`

	// sqlLeaseRelease expires the lease now and keeps its generation.
	sqlLeaseRelease = `
UPDATE ledger.leases SET expires_at = clock_timestamp()
WHERE partition = $1 AND holder = $2 AND generation = $3 AND expires_at > clock_timestamp()
RETURNING partition`

	sqlLeaseGet = `
SELECT holder, generation, expires_at, ttl_ms, expires_at > clock_timestamp()
FROM ledger.leases WHERE partition = $1`

	sqlLeaseList = `
SELECT partition, holder, generation, expires_at, ttl_ms, expires_at > clock_timestamp()
FROM ledger.leases ORDER BY partition`

	// sqlTaskHead reads a task's head and whether versions of it are
	// archived: those below its first version still in the hot log.
	sqlTaskHead = `
SELECT h.partition, h.version, h.seq, h.type, coalesce(h.owner, ''),
       CASE WHEN h.first_seq < z.below_seq THEN coalesce(
           (SELECT min(e.version) FROM ledger.events e
            WHERE e.task_id = h.task_id AND e.seq >= z.below_seq AND e.seq <= h.seq), h.version + 1) - 1
       ELSE 0 END, h.kind
FROM ledger.heads h CROSS JOIN ledger.horizon z WHERE h.task_id = $1`

	// sqlTaskHeads reads the heads of many tasks in one statement, by their
	// position in $1; sqlTaskHeadsArchived, sent with it, how many versions
	// are archived of those whose history is partly archived (only after
	// ledgerctl archive; usually none). Apart, each is planned as what it
	// is: a key probe per task, and the search of the hot log only for the
	// few tasks that need it.
	sqlTaskHeads = `
SELECT t.ord, h.partition, h.version, h.seq, h.type, coalesce(h.owner, ''), h.kind
FROM unnest($1::text[]) WITH ORDINALITY AS t(task_id, ord)
JOIN ledger.heads h ON h.task_id = t.task_id`
	sqlTaskHeadsArchived = `
SELECT h.task_id, coalesce((SELECT min(e.version) FROM ledger.events e
                            WHERE e.task_id = h.task_id AND e.seq >= z.below_seq AND e.seq <= h.seq), h.version + 1) - 1
FROM ledger.heads h CROSS JOIN ledger.horizon z
WHERE h.task_id = ANY($1::text[]) AND h.first_seq < z.below_seq`

	// sqlAppendLockLeases locks the batch's lease rows FOR KEY SHARE until
	// commit and reads them for classification. Three lock modes on
	// ledger.leases carry the protocol (doc.go, Fence and Finality):
	//
	//   - Every append takes its lease rows FOR KEY SHARE, in its first
	//     statement, until commit.
	//   - An append that will record a rejection rolls back, having written
	//     nothing, and takes the rows FOR UPDATE instead
	//     (sqlAppendLockLeasesExclusive). Then it reads and decides again.
	//   - A takeover or re-grant takes the row FOR UPDATE (sqlLeaseLock).
	//     Renew and release update non-key columns: FOR NO KEY UPDATE.
	//
	// FOR KEY SHARE conflicts only with FOR UPDATE. So a takeover waits for
	// every append on the partition, and every append waits for a takeover.
	// Renew and release wait for no append, so a stream of appends cannot
	// starve a renewal. PostgreSQL lets a new share locker pass a waiting
	// updater; with FOR SHARE a renewal queued behind appends for over a
	// second. The cost: a renewal can wait for an exclusive append, which is
	// short and rare.
	//
	// Renew and release need not wait: neither grants a generation. A
	// release can commit while an append of the same generation is in
	// flight. If the append's insert ran first, its rows commit, of the
	// released generation; the next grant (FOR UPDATE) still waits for
	// them. If the insert runs after the release, it sees the lease expired
	// and ledger.fence_check aborts the attempt (stale/lease_expired).
	sqlAppendLockLeases = sqlAppendLockLeasesRead + `FOR KEY SHARE`

	// sqlAppendLockLeasesExclusive is the lock of an append that will record
	// a rejection: FOR UPDATE excludes every other append on those
	// partitions, so an event id cannot be rejected by this transaction
	// while another commits it (doc.go, Finality). The append reads heads,
	// stored rows and recorded verdicts only after it holds these locks. A
	// copy committed before it locked is then read and wins. A copy
	// appended after it committed reads its verdict and repeats it. A
	// redelivered copy carries its partition, so both take the same row.
	// Copies of one id published on two partitions are different messages
	// and are not serialised; committed still wins for every later copy.
	// Invalid verdicts are decided from the message alone and not recorded,
	// except not_owner, so that the verdict lookup answers it.
	sqlAppendLockLeasesExclusive = sqlAppendLockLeasesRead + `FOR UPDATE`

	sqlAppendLockLeasesRead = `
SELECT l.partition, l.holder, l.generation, l.expires_at > clock_timestamp(),
       EXISTS (SELECT FROM ledger.fence_modes m WHERE m.partition = l.partition AND m.mode = 'observe')
FROM ledger.leases l WHERE l.partition = ANY($1::int[])
ORDER BY l.partition `

	// sqlAppendRecorded reads the verdict recorded for each event id, the
	// earliest if an id has several (rows written before finality was
	// enforced). One probe of rejections_event_id_idx per id.
	sqlAppendRecorded = `
SELECT DISTINCT ON (event_id) event_id, verdict, reason
FROM ledger.rejections WHERE event_id = ANY($1::text[])
ORDER BY event_id, id`

	// sqlLocalStatementTimeout bounds the statements of a long
	// operation's transaction, in milliseconds.
	sqlLocalStatementTimeout = `SELECT set_config('statement_timeout', $1, true)`

	// sqlSetTimeouts bounds the transaction it runs in (Config), in
	// milliseconds, 0 for none. A stricter timeout the session already
	// has (the server's for the role or database, as a provider sets it)
	// is kept.
	sqlSetTimeouts = `
WITH t(name, want, cur) AS (VALUES
    ('statement_timeout', $1::bigint, extract(epoch FROM current_setting('statement_timeout')::interval) * 1000),
    ('idle_in_transaction_session_timeout', $2::bigint,
     extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000))
SELECT set_config(name, (CASE WHEN cur > 0 AND (want = 0 OR cur < want) THEN cur ELSE want END)::bigint::text, true)
FROM t`

	// sqlAppendHeads reads each task's head from ledger.heads, one probe of
	// its primary key per task, whatever the length of the log.
	sqlAppendHeads = `
SELECT task_id, partition, version, first_seq, coalesce(owner, ''), kind = 'snapshot' FROM ledger.heads WHERE task_id = ANY($1::text[])`

	// sqlAppendHeadsFromLog reads the heads from the log itself, as before
	// ledger.heads: only the negative control of the archive tests uses it,
	// to show that a head read from the hot log forgets archived versions.
	sqlAppendHeadsFromLog = `
SELECT t.task_id, h.partition, h.version, 1::bigint, '', false
FROM unnest($1::text[]) AS t(task_id)
CROSS JOIN LATERAL (
    SELECT e.partition, e.version FROM ledger.events e
    WHERE e.task_id = t.task_id ORDER BY e.version DESC LIMIT 1
) h`

	// sqlAppendHorizon reads what was archived (ledger.horizon). It is read
	// after the lease locks: the horizon moves only under every lease row
	// FOR UPDATE (archive.go), so an append sees one horizon from its
	// reads to its commit.
	sqlAppendHorizon = `SELECT below_seq, id_floor FROM ledger.horizon`

	// sqlAppendExisting finds committed rows that share an event id or a
	// (task, version) with the given events. Payloads are compared as jsonb,
	// and only for rows that matched. It runs only for the events that can
	// match: those at or below their task's head, those whose id is older
	// than the id floor, or all of them when an optimistic insert found an
	// unexpected key.
	//
	// An id is found in ledger.event_ids, and its row joined by seq; an id
	// whose row was archived comes back without one (hot false). A (task,
	// version) is looked for only between the task's first and last seq,
	// so only the partitions the task spans are searched.
	sqlAppendExisting = `
SELECT i.ord, true, x.seq, e.seq IS NOT NULL, coalesce(e.event_id, ''), coalesce(e.partition, 0),
       coalesce(e.task_id, ''), coalesce(e.version, 0), coalesce(e.type, ''), coalesce(e.payload::text, ''),
       coalesce(e.holder, ''), coalesce(e.generation, 0), coalesce(e.committed_at, 'epoch'),
       coalesce(e.payload = i.payload::jsonb, false)
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) WITH ORDINALITY AS i(event_id, task_id, version, payload, ord)
JOIN ledger.event_ids x ON x.event_id = i.event_id
LEFT JOIN ledger.events e ON e.seq = x.seq
UNION ALL
SELECT i.ord, false, e.seq, true, e.event_id, e.partition, e.task_id, e.version, e.type,
       e.payload::text, e.holder, e.generation, e.committed_at, e.payload = i.payload::jsonb
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) WITH ORDINALITY AS i(event_id, task_id, version, payload, ord)
JOIN ledger.heads h ON h.task_id = i.task_id
JOIN ledger.events e ON e.task_id = i.task_id AND e.version = i.version AND e.seq >= h.first_seq AND e.seq <= h.seq`

	// sqlAppendInsert is the fenced conditional insert. The fence predicate
	// is part of this statement: a row is inserted only where the lease row
	// of its partition shows its holder and generation and has not expired by
	// this statement's clock. The transaction already holds those lease rows
	// locked (sqlAppendLockLeases, its first statement) until commit;
	// locking them again per inserted row would cost a tenth of the insert.
	//
	// $9 is how many rows the append expects to insert. If fewer pass the
	// fence (a lease expired after it was read), ledger.fence_check raises
	// and the transaction aborts, so the COMMIT sent in the same round trip
	// cannot commit part of the batch.
	//
	// The same statement records each id in ledger.event_ids, unless it was
	// minted before the id floor: an append that read the horizon before an
	// archive moved it may plan such an id as new, and ledger.ids_check then
	// fails the statement so that the batch is decided again (doc.go,
	// Growth). It moves each task's head in ledger.heads: a task's head
	// moves from exactly the version the batch planned from ($12: the head
	// its first commit of the task was decided against), or not at all; a
	// new task's head takes the kind its first event says ($13). It writes
	// where each head moved from (moved_from), which the database's fence
	// would otherwise write in a row trigger, a call for each head
	// (migration 00020). The UPDATE waits for the row lock of a
	// concurrent writer of the task and then finds the head moved; the
	// INSERT of a new task's head waits for a concurrent insert of the same
	// task and then finds it there. ledger.heads_check (migration 00006)
	// then raises unique_violation, as a duplicate event id does in
	// ledger.event_ids, and Append re-runs the batch with full lookups.
	sqlAppendInsert = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
ins AS (
    INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at,
                               would_reject)
    SELECT i.event_id, i.partition, i.task_id, i.version, i.type, i.payload::jsonb, i.holder, i.generation,
           (SELECT t FROM now), i.would_reject
    FROM unnest($1::text[], $2::int[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::bigint[],
                $10::text[])
         WITH ORDINALITY AS i(event_id, partition, task_id, version, type, payload, holder, generation, would_reject, ord)
    JOIN ledger.leases l ON l.partition = i.partition
    WHERE l.holder = i.holder AND l.generation = i.generation AND l.expires_at > (SELECT t FROM now)
      OR (i.would_reject IS NOT NULL AND EXISTS (
          SELECT FROM ledger.fence_modes m WHERE m.partition = i.partition AND m.mode = 'observe'))
    ORDER BY i.ord
    RETURNING event_id, seq, committed_at, partition, task_id, version, type, holder
),
ids AS (
    INSERT INTO ledger.event_ids (event_id, seq)
    SELECT event_id, seq FROM ins
    WHERE upper(left(event_id, 10)) >= (SELECT id_floor FROM ledger.horizon)
    RETURNING 1
),
moves AS (
    SELECT DISTINCT ON (task_id) task_id, partition, version, seq, type, split_part(holder, '.', 1) AS owner,
           p.prev, p.kind, min(seq) OVER w AS first_seq
    FROM ins JOIN unnest($11::text[], $12::bigint[], $13::text[]) AS p(task_id, prev, kind) USING (task_id)
    WINDOW w AS (PARTITION BY task_id)
    ORDER BY task_id, version DESC
),
moved AS (
    UPDATE ledger.heads h SET version = m.version, seq = m.seq, type = m.type, moved_from = h.version
    FROM moves m
    WHERE h.task_id = m.task_id AND m.prev > 0 AND h.version = m.prev
    RETURNING 1
),
born AS (
    INSERT INTO ledger.heads (task_id, partition, version, seq, type, first_seq, owner, kind, moved_from)
    SELECT task_id, partition, version, seq, type, first_seq, owner, kind, 0 FROM moves WHERE prev = 0
    ORDER BY task_id
    ON CONFLICT (task_id) DO NOTHING
    RETURNING 1
)
SELECT event_id, seq, committed_at FROM ins
UNION ALL
SELECT NULL, NULL, NULL WHERE ledger.fence_check($9::bigint, (SELECT count(*) FROM ins))
UNION ALL
SELECT NULL, NULL, NULL WHERE ledger.ids_check((SELECT count(*) FROM ins), (SELECT count(*) FROM ids))
UNION ALL
SELECT NULL, NULL, NULL WHERE ledger.heads_check((SELECT count(*) FROM moves),
                                                 (SELECT count(*) FROM moved) + (SELECT count(*) FROM born))`

	sqlAppendRejections = `
INSERT INTO ledger.rejections
    (event_id, partition, task_id, version, holder, generation, verdict, reason, current_generation)
SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::bigint[], $5::text[], $6::bigint[],
                     $7::text[], $8::text[], $9::bigint[])`

	// sqlProbeInsert inserts events without fence or lookups. Only isolate
	// runs it, under a savepoint of a transaction it rolls back, to find
	// which event's own row PostgreSQL refuses (a payload, a trigger, a
	// constraint). ledger.events has no unique key but seq (migration
	// 00006), so a row whose id or version is already stored is inserted
	// like any other and blames no event.
	sqlProbeInsert = `
INSERT INTO ledger.events (event_id, partition, task_id, version, type, payload, holder, generation, committed_at)
SELECT i.event_id, i.partition, i.task_id, i.version, i.type, i.payload::jsonb, i.holder, i.generation, clock_timestamp()
FROM unnest($1::text[], $2::int[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::bigint[])
     AS i(event_id, partition, task_id, version, type, payload, holder, generation)`
)

// appendFencePredicate is the fence's line of sqlAppendInsert.
const appendFencePredicate = `
    WHERE l.holder = i.holder AND l.generation = i.generation AND l.expires_at > (SELECT t FROM now)`

// appendObservePredicate lets through a row the fence refuses only when
// the append marked it would_reject and its partition is in observe mode
// (modes.go): the mode is checked again where the row is written.
const appendObservePredicate = `
      OR (i.would_reject IS NOT NULL AND EXISTS (
          SELECT FROM ledger.fence_modes m WHERE m.partition = i.partition AND m.mode = 'observe'))`

// appendFenceJoin is the join of sqlAppendInsert to the leases the fence
// predicate reads.
const appendFenceJoin = `
    JOIN ledger.leases l ON l.partition = i.partition`

// sqlAppendInsertUnfenced is sqlAppendInsert without the fence: no join to
// the leases, no predicate. It exists only for the test that proves the race
// checker can fail; no exported API reaches it.
var sqlAppendInsertUnfenced = without(sqlAppendInsert, appendObservePredicate, appendFencePredicate, appendFenceJoin)

// appendHeadsPredicate and appendHeadsCheck are what make sqlAppendInsert
// move a head only from the version the batch planned from, or fail;
// appendFloorPredicate and appendFloorCheck what make it refuse an id
// minted before the id floor.
const (
	appendHeadsPredicate = ` AND h.version = m.prev`
	appendHeadsCheck     = `
UNION ALL
SELECT NULL, NULL, NULL WHERE ledger.heads_check((SELECT count(*) FROM moves),
                                                 (SELECT count(*) FROM moved) + (SELECT count(*) FROM born))`
	appendFloorPredicate = `
    WHERE upper(left(event_id, 10)) >= (SELECT id_floor FROM ledger.horizon)`
	appendFloorCheck = `
UNION ALL
SELECT NULL, NULL, NULL WHERE ledger.ids_check((SELECT count(*) FROM ins), (SELECT count(*) FROM ids))`
)

// without returns sql without each of parts, which it must hold once. The
// tests' negative controls switch mechanisms off with it; no exported API
// reaches the result.
func without(sql string, parts ...string) string {
	for _, p := range parts {
		if strings.Count(sql, p) != 1 {
			panic(fmt.Sprintf("fence: sqlAppendInsert no longer holds %q once", p))
		}
		sql = strings.Replace(sql, p, "", 1)
	}
	return sql
}

// sqlEnsureTimeouts bounds the wait of ledger.ensure_partitions for the
// lock on ledger.events (partitions.go).
const sqlEnsureTimeouts = `SELECT set_config('lock_timeout', $1, true)`

// sqlEnsurePartitions makes partitions ahead of seq $1 (migration 00006).
const sqlEnsurePartitions = `SELECT partitions_end, rows_per_partition FROM ledger.ensure_partitions($1)`

// sqlCommittedBetween reads a task's committed events strictly between two
// versions, in version order; archived versions are not among them.
const sqlCommittedBetween = `
SELECT e.seq, e.event_id, e.partition, e.task_id, e.version, e.type, e.payload::text, e.holder, e.generation, e.committed_at,
       h.kind = 'snapshot'
FROM ledger.heads h JOIN ledger.events e ON e.task_id = h.task_id AND e.seq >= h.first_seq AND e.seq <= h.seq
WHERE h.task_id = $1 AND e.version > $2 AND e.version < $3 ORDER BY e.version`

// sqlEventVerdict finds the final verdict recorded for event $1 of task $2
// (lookup.go): its committed row, or else its first rejection, since a
// verdict is never reversed and later copies only repeat it. Beyond the
// hot log: an id whose row was archived answers committed if its seq lies
// within the task's history; an id minted before the id floor that the
// ledger no longer holds answers what an append of it gets,
// invalid/before_horizon ($3, $4).
const sqlEventVerdict = `
SELECT verdict, reason, seq FROM (
    SELECT 'committed' AS verdict, '' AS reason, x.seq, 0 AS rank
    FROM ledger.event_ids x JOIN ledger.events e ON e.seq = x.seq
    WHERE x.event_id = $1 AND e.task_id = $2
    UNION ALL
    (SELECT verdict, reason, 0, 1 FROM ledger.rejections
     WHERE event_id = $1 AND task_id = $2 ORDER BY id LIMIT 1)
    UNION ALL
    SELECT 'committed', '', x.seq, 2
    FROM ledger.event_ids x JOIN ledger.heads h ON h.task_id = $2 AND x.seq BETWEEN h.first_seq AND h.seq
    WHERE x.event_id = $1 AND NOT EXISTS (SELECT FROM ledger.events e WHERE e.seq = x.seq)
    UNION ALL
    SELECT $3::text, $4::text, 0, 3 FROM ledger.horizon z
    WHERE upper(left($1, 10)) < z.id_floor AND NOT EXISTS (SELECT FROM ledger.event_ids x WHERE x.event_id = $1)
) v ORDER BY rank LIMIT 1`

// sqlEventContent reads the content of the hot row at seq $1, which
// VerdictFor compares with what a publisher sent; no row: it is archived.
const sqlEventContent = `SELECT version, type, payload::text FROM ledger.events WHERE seq = $1`

// The archive's statements (archive.go). They run as the schema's owner.
const (
	sqlArchiveHorizon = `SELECT below_seq, id_floor, id_floor_at FROM ledger.horizon`

	// sqlArchiveDrawn is the newest seq drawn: a partition whose range ends
	// at or below it receives no more rows.
	sqlArchiveDrawn = `
SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('ledger.events', 'seq')::regclass), 0)`

	// sqlArchivePartitions lists the partitions not archived yet, oldest
	// first, with the commit time of each one's highest seq (one backward
	// probe of its primary key; null when it is empty or detached).
	sqlArchivePartitions = `
SELECT p.lo, p.hi, p.name,
       (SELECT e.committed_at FROM ledger.events e WHERE e.seq >= p.lo AND e.seq < p.hi ORDER BY e.seq DESC LIMIT 1)
FROM ledger.event_partitions p WHERE p.archived_at IS NULL ORDER BY p.lo`

	// sqlArchiveMoveHorizon raises the horizon; neither bound ever falls.
	sqlArchiveMoveHorizon = `
UPDATE ledger.horizon
SET below_seq = greatest(below_seq, $1),
    id_floor = greatest(id_floor, $2::text),
    id_floor_at = CASE WHEN $2::text > id_floor THEN $3::timestamptz ELSE id_floor_at END,
    moved_at = clock_timestamp()
RETURNING below_seq, id_floor, id_floor_at`

	// sqlArchivePartitionState tells whether a partition is attached, and
	// whether a concurrent detach of it was interrupted.
	sqlArchivePartitionState = `
SELECT coalesce(bool_or(i.inhrelid IS NOT NULL), false), coalesce(bool_or(i.inhdetachpending), false)
FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
WHERE c.relnamespace = 'ledger'::regnamespace AND c.relname = $1`

	// sqlArchiveRecord records an archived partition's file.
	sqlArchiveRecord = `
UPDATE ledger.event_partitions
SET archived_at = clock_timestamp(), rows = $2, file = $3, sha256 = $4, bytes = $5,
    first_committed_at = $6, last_committed_at = $7
WHERE lo = $1`
)

// sqlEventVerdicts is sqlEventVerdict for many lookups in one statement:
// ($1[i], $2[i]) is the i-th (event id, task), answered by its position.
// The lateral subquery is sqlEventVerdict's, so each lookup is judged by
// the same rule; a committed hot row comes with its content, which
// VerdictsFor compares with what the publisher sent (no content: the row
// is archived). Lookups without a verdict have no row.
const sqlEventVerdicts = `
SELECT l.ord, v.verdict, v.reason, v.seq, e.version, e.type, e.payload::text
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS l(event_id, task_id, ord)
CROSS JOIN LATERAL (
    SELECT verdict, reason, seq FROM (
        SELECT 'committed' AS verdict, '' AS reason, x.seq, 0 AS rank
        FROM ledger.event_ids x JOIN ledger.events e ON e.seq = x.seq
        WHERE x.event_id = l.event_id AND e.task_id = l.task_id
        UNION ALL
        (SELECT r.verdict, r.reason, 0, 1 FROM ledger.rejections r
         WHERE r.event_id = l.event_id AND r.task_id = l.task_id ORDER BY r.id LIMIT 1)
        UNION ALL
        SELECT 'committed', '', x.seq, 2
        FROM ledger.event_ids x JOIN ledger.heads h ON h.task_id = l.task_id AND x.seq BETWEEN h.first_seq AND h.seq
        WHERE x.event_id = l.event_id AND NOT EXISTS (SELECT FROM ledger.events e WHERE e.seq = x.seq)
        UNION ALL
        SELECT $3::text, $4::text, 0, 3 FROM ledger.horizon z
        WHERE upper(left(l.event_id, 10)) < z.id_floor
          AND NOT EXISTS (SELECT FROM ledger.event_ids x WHERE x.event_id = l.event_id)
    ) w ORDER BY rank LIMIT 1
) v
LEFT JOIN ledger.events e ON v.verdict = 'committed' AND e.seq = v.seq`

// sqlPartitionBetween reads partition $1's commits with $2 < seq < $3
// among the newest $4 of the ledger; with $2 = 0, only those of the last
// $5 seconds (read.go, PartitionBetween).
const sqlPartitionBetween = `
SELECT e.seq, e.event_id, e.partition, e.task_id, e.version, e.type, e.payload::text, e.holder, e.generation, e.committed_at,
       coalesce(h.kind = 'snapshot', false), e.would_reject
FROM ledger.events e LEFT JOIN ledger.heads h ON h.task_id = e.task_id
WHERE e.partition = $1 AND e.seq < $3
  AND e.seq > greatest($2, (SELECT coalesce(max(seq), 0) FROM ledger.events) - $4)
  AND ($2 > 0 OR e.committed_at > now() - make_interval(secs => $5))
ORDER BY e.seq`
