// Package fence is the ledger's storage core on PostgreSQL: partition leases
// with generation fencing tokens, and the fenced, set-based append of
// generation-tagged events.
//
// # Leases
//
// Each partition has at most one lease row: holder, generation and
// expires_at. The database clock (clock_timestamp(), read when the statement
// runs, never a client clock) decides expiry.
//
//   - Acquire on a partition never leased grants generation 1.
//   - Acquire on an expired lease is a compare-and-swap: under a row lock the
//     lease is replaced only if it still shows the generation the taker
//     observed and is still expired; the generation rises by one and a row is
//     added to ledger.lease_grants in the same transaction. TakeOver exposes
//     the compare-and-swap with an explicit observed generation, so of many
//     takers that observed the same generation exactly one wins.
//   - Acquire on a valid lease of another holder fails with ErrHeld; the same
//     holder re-acquiring gets generation + 1 at once, fencing its own
//     earlier incarnation.
//   - Renew and Release succeed only for the current holder and generation of
//     an unexpired lease, otherwise ErrLost. Release expires the lease and
//     keeps its generation; the next Acquire bumps it.
//
// # The fenced append
//
// Append commits a batch of events in one transaction. Every event gets one
// Result, checked in the contract's order: invalid, duplicate, stale,
// conflict, not yet (or gap once its window closed), committed; an event id
// that already has a recorded verdict gets that verdict again (Finality).
//
// # Lock modes
//
// Three row lock modes on ledger.leases carry the protocol:
//
//   - Every append locks its batch's lease rows FOR KEY SHARE, from its first
//     statement until commit (sqlAppendLockLeases).
//   - An append that will record a rejection gives those locks up (it rolls
//     back, having written nothing) and locks the rows FOR UPDATE instead,
//     again from its first statement, then reads and decides again
//     (sqlAppendLockLeasesExclusive).
//   - A takeover or re-grant locks the row FOR UPDATE (sqlLeaseLock). Renew
//     and release are plain UPDATEs of non-key columns: FOR NO KEY UPDATE.
//
// FOR KEY SHARE conflicts only with FOR UPDATE. So a takeover waits for
// every append on the partition and every append waits for a takeover, an
// exclusive append and the other appends exclude each other, and renew and
// release wait for neither kind of append, so a stream of appends cannot
// starve a renewal (PostgreSQL lets a new share locker pass a waiting
// updater; with FOR SHARE a renewal queued behind appends for over a
// second). The cost: a renewal can wait for an exclusive append, which is
// short and rare.
//
// # Invariants
//
// The invariants, and what makes them hold:
//
//  1. Fence. A row of generation g on partition p is inserted only by the
//     INSERT statement whose own WHERE clause requires the lease row of p to
//     show the event's holder, generation g, and expires_at later than that
//     statement's clock. The lease rows of the batch are locked FOR KEY
//     SHARE (or FOR UPDATE) from the first statement of the transaction
//     until commit, and a takeover must lock the same row FOR UPDATE, so it
//     waits: in commit order every event of generation g precedes the grant
//     of g + 1, and an append that starts after a takeover returned sees the
//     new generation and is refused (stale/superseded).
//
//     Renew and release do not wait for an append, and need not: neither
//     grants a generation. A renewal only moves expires_at later. A release
//     can commit while an append of the same holder and generation is in
//     flight; if the append's insert ran before it, the append's rows
//     commit although the lease has been released: they are of the
//     released generation, and the next grant (a takeover, FOR UPDATE)
//     still waits for the append's commit, so they precede it. An insert
//     that runs after the release sees the lease expired and refuses its
//     rows (ledger.fence_check aborts the transaction, and the batch is
//     decided again: stale/lease_expired).
//
//  2. Dense versions. A task's versions are 1, 2, 3, ... with no hole and
//     none twice, archived ones included: an event commits only as head + 1,
//     counting earlier events of the same batch, and the head is the task's
//     row in ledger.heads, which archiving never removes. The insert that
//     commits a task's versions moves that row in the same statement, and
//     only from the version the batch planned from (UPDATE ... WHERE
//     version = planned; for a new task, INSERT ... ON CONFLICT DO
//     NOTHING); ledger.heads_check fails the statement unless every head
//     moved. So two writers racing on one task are serialised by the head
//     row: the second's UPDATE waits for the first's row lock, then finds
//     the head moved and changes nothing; the second's INSERT of a new
//     task's head waits for the first's uncommitted row, then finds it. Its
//     statement fails with unique_violation, the transaction is retried,
//     and it then reads the winner's row. This holds for any two writers of
//     a task, whatever leases they hold: writers of one partition share its
//     lease row only FOR KEY SHARE, which serialises nothing between them.
//
//  3. Idempotence. An event id, or a (task, version), that is already
//     committed with identical content is a duplicate: nothing is written and
//     the original seq is returned. The same key with different content is a
//     conflict, recorded, never dropped. Content is compared as jsonb
//     compares it: in SQL for stored rows, and by canonjson's canonical form
//     (linear in the payload, never a bignum) within a batch. An id commits
//     at most once: ledger.event_ids holds every id of the hot log under a
//     unique key, inserted by the same statement as the row. For history
//     that was archived, see Growth.
//
//  4. Pinning. A task stays on the partition of its version 1; an event on
//     another partition is invalid (wrong_partition).
//
//     A task also belongs to the principal of its version 1's holder
//     (ledger.heads.owner, written with that version). Another principal's
//     event on it is invalid (not_owner) and recorded, unless
//     Config.SharedTasks; a cached head carries its owner, so the fast path
//     predicts the refusal and leaves it to the careful path.
//
//  5. Record. Stale, conflict and gap outcomes are written to
//     ledger.rejections in the same transaction as the batch's commits.
//
//  6. Finality. An event id has one final verdict. An id that is committed
//     is answered as in 3 (committed wins). An id that is not committed but
//     has a row in ledger.rejections gets that verdict and reason again,
//     whatever the copy's content or stamp (Result.Repeat), and no second
//     row; so does a second copy of an id within one batch after the first
//     was rejected. The recorded verdicts are read, by event id, in the
//     first round trip of every attempt. Two transactions cannot decide one
//     id both ways: the one that records a rejection holds the lease rows
//     of its partitions FOR UPDATE from its first statement, which excludes
//     every append (FOR KEY SHARE) on them, and reads heads, stored rows and
//     recorded verdicts only after it has them. A copy committed before it
//     locked is then read and wins; a copy appended after it committed
//     reads its row and repeats it. A redelivered copy carries its
//     partition, so both take the same row. (Copies of an id published on
//     two partitions are different messages, not redeliveries, and are not
//     serialised: committed still wins for every later copy.) Invalid
//     verdicts are not recorded: they are decided from the message alone,
//     so a redelivery gets the same one. not_owner is the exception: it is
//     recorded, so that the verdict lookup answers it.
//
//  7. Bounded payloads. A payload is refused at the door (invalid,
//     bad_payload) unless jsonb can store it and render it small: valid
//     UTF-8 JSON without \u0000 or unpaired surrogates, nesting at most
//     MaxPayloadDepth, numbers of at most MaxNumberDigits digits and an
//     exponent within ±MaxNumberExponent, and rendered numbers together at
//     most the payload's size plus MaxNumberGrowthSlack longer than written.
//     The check is one linear scan.
//
//  8. Transience. Failures of the database (connection lost, serialisation
//     or deadlock, shutdown, a statement cancelled) are returned as errors,
//     never as verdicts; the whole batch is then rolled back and may simply
//     be retried. An error is classified once: a data error that PostgreSQL
//     raises for the batch's rows (SQLSTATE classes 22, 23, 54, P0) is
//     traced to the events that cause it on their own (isolate: probe
//     inserts, halving the set, in a transaction rolled back), which become
//     invalid (bad_payload, with the SQLSTATE in Detail) while the rest of
//     the batch commits; any other error is the database's or the
//     deployment's and is returned, never anyone's verdict. So is a row
//     that finds no partition of ledger.events (check_violation without a
//     constraint): the partitions are made and the batch runs again.
//
//  9. Bounded locks. Every append and takeover transaction sets
//     statement_timeout and idle_in_transaction_session_timeout locally
//     (Config.StatementTimeout, Config.IdleInTransactionTimeout, 30 s), or
//     keeps the session's own where it is stricter (a provider's, for the
//     role; sqlSetTimeouts), so a client gone silent or a runaway statement
//     releases its lease rows within that time, not when TCP gives up;
//     ConfigurePool adds TCP keepalives on both ends. Tested in
//     timeouts_test.go. The client bounds each append attempt by its
//     own clock as well (Config.AttemptTimeout, 65 s): a connection dropped
//     in between without a reset carries no statement to the server, whose
//     timeouts then never start; the attempt fails with ErrNoAnswer, a
//     transient error, and the caller retries on a fresh connection.
//
// The batch costs a fixed handful of statements whatever its size, in two
// pipelined round trips: BEGIN, the timeouts, the lease lock, the reads of
// the heads of tasks this process has not cached and of the recorded
// verdicts and the horizon; then one INSERT ... SELECT FROM unnest(...) for
// the commits (with their ids and heads), one for the rejections, and
// COMMIT. A lookup of the stored rows that events at or below their head
// may collide with (usually none) takes a third, and a batch that records a
// rejection reads once more under its exclusive locks.
// COMMIT travels with the insert, so the insert itself must fail when a row
// does not pass the fence (a lease that expired after it was read):
// ledger.fence_check (migration 00003) compares the rows inserted with the
// rows planned and raises, which aborts the transaction, and the batch runs
// again.
//
// Most batches need no reading first: a worker sends its tasks' next
// versions under the lease it holds. When every task's head is cached and
// every event carries the holder and generation the store last read under
// the lease lock, and the batch so predicted is all commits, the append
// sends everything in one round trip: BEGIN, the timeouts, the lease lock,
// ledger.unrecorded_check on the recorded verdicts (migration 00008), the
// fenced insert and COMMIT. What the careful path would have read is
// checked where it stands, under the same locks: the fence
// (ledger.fence_check), the heads (ledger.heads_check), the ids (their
// unique key and ledger.ids_check) and the recorded verdicts. A miss raises
// before COMMIT, nothing is written, and the batch is decided again the
// careful way.
//
// # The database's own fence
//
// Migration 00012 makes PostgreSQL refuse, to every role but the schema's
// owner, what the fence refuses: statement triggers check each statement's
// events against their leases (locked FOR KEY SHARE until commit) and
// against the heads moved in the same statement, heads against the rows
// they rise onto, event ids against their rows, and every lease move
// against the compare-and-swap (docs/security.md). Migration 00017 holds
// rejections to the same: a row of ledger.rejections must be the verdict
// the fence gives its event (LF007), and a grant must lie within the
// grantee's partition ranges where an operator set them (LFP01, every
// role). Migration 00018 makes each statement trigger one query. The
// append's own statements pass them unchanged; a trigger's refusal is an
// error of the fence's own SQLSTATE (LF001, LF005, LF006, LF007), never a
// verdict.
//
// # Growth
//
// The cost of an append does not grow with the ledger's age. What an
// append consults, and the promise each structure keeps:
//
//   - ledger.heads, one row per task ever committed (partition, version,
//     seq, type, and first_seq, the seq of version 1): dense versions and
//     pinning (2, 4), for archived history too. One primary-key probe per
//     task; it grows with the number of tasks, not of events.
//   - ledger.event_ids, one row per event id of the hot log: idempotence by
//     id (3). Ids are ULIDs, which rise with time, so its index grows at
//     its right edge. An archive removes the ids of the rows it moves that
//     were minted before the id floor.
//   - ledger.events, partitioned by seq range (ledger.partitioning, default
//     4,194,304 rows a partition): rows land in the newest partition, so
//     the (task_id, version) index an insert touches at random is that
//     partition's. A lookup of a task's rows is bounded by its first_seq
//     and seq, so it searches only the partitions the task spans.
//     Partitions are made ahead of need by the appends themselves
//     (partitions.go); a missing one is made at once, and is never a
//     verdict.
//   - ledger.horizon: what was archived. Every row with seq < below_seq,
//     and every id minted before id_floor (the first 10 characters of a
//     ULID, its time).
//
// Archived history (Store.Archive, archive.go) keeps every promise but
// one, which it bounds. A version at or below a task's head is still
// taken; if its row is archived its content can no longer be compared, and
// the event is a conflict (reason archived), recorded, never committed. An
// id found in ledger.event_ids whose row is archived is the same conflict.
// An id that is not in the hot log and was minted before the id floor may
// have been committed and archived with its id: it is refused as invalid
// (before_horizon), never committed. So an event id is recognised for
// ever if it was minted at or after the floor; one minted before the
// floor is recognised while its row is hot (a worker that mints its ids
// when it first publishes re-sends within the retention are always
// recognised), and never committed twice either way. The floor only rises.
//
// Why an append never commits an archived id, whichever order things
// happen in: the archive raises the floor before it removes any id, and the
// insert itself refuses to record an id minted before the floor it reads
// (ledger.ids_check, unique_violation: the batch is decided again with the
// new horizon). An insert that began before the floor rose holds a lock on
// ledger.events until it commits; the archive removes ids only after
// detaching the partition CONCURRENTLY, which waits for every such lock
// holder, so that insert met the id still in ledger.event_ids.
//
// The lookups are optimistic. An event planned as head + 1 is not looked up
// (unless its id was minted before the id floor); if its id or (task,
// version) is in fact taken (an id reused under another task, a head
// another process moved on), the INSERT fails with unique_violation (the
// id's key in ledger.event_ids, or ledger.heads_check) and the batch is
// rerun with every head read from the database and every event looked up. An event that will not commit is never decided
// without that full lookup, so a cached head or a skipped lookup can cost a
// retry, never a wrong verdict. A cached head is never above the truth: it
// is written only after a commit, and heads only rise.
//
// The operator's fence (operator.go, migration 00014) and the shadow fence
// (modes.go, migration 00015) keep these rules:
//   - A revoke takes the lease row FOR UPDATE, like a takeover: every
//     event of the revoked generation commits before it or not at all. It
//     raises the generation and grants it to nobody.
//   - A cordon is checked by a trigger on ledger.lease_grants, in the
//     statement that moves the lease: no path grants a cordoned partition.
//   - The fence mode is read with the lease row, under the append's lock,
//     and a switch takes that row FOR UPDATE: an append decides and commits
//     under one mode. The insert lets a row the fence refuses through only
//     when it is marked would_reject and the mode it reads is observe.
package fence
