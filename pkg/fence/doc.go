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
// conflict, not yet (or gap once its window closed), committed.
//
// The invariants, and what makes them hold:
//
//  1. Fence. A row of generation g on partition p is inserted only by the
//     INSERT statement whose own WHERE clause requires the lease row of p to
//     show the event's holder, generation g, and expires_at later than that
//     statement's clock. The lease rows of the batch are locked FOR SHARE
//     from the first statement of the transaction until commit, and a
//     takeover must lock the same row FOR UPDATE, so it waits: in commit
//     order every event of generation g precedes the grant of g + 1, and an
//     append that starts after a takeover returned sees the new generation
//     and is refused (stale/superseded).
//  2. Dense versions. A task's versions are 1, 2, 3, ... with no hole: an
//     event commits only as head + 1, counting earlier events of the same
//     batch. Two writers racing on one task are serialised by the unique
//     index on (task_id, version); the loser's transaction is retried and
//     then sees the winner's row.
//  3. Idempotence. An event id, or a (task, version), that is already
//     committed with identical content is a duplicate: nothing is written and
//     the original seq is returned. The same key with different content is a
//     conflict, recorded, never dropped.
//  4. Pinning. A task stays on the partition of its version 1; an event on
//     another partition is invalid (wrong_partition).
//  5. Record. Stale, conflict and gap outcomes are written to
//     ledger.rejections in the same transaction as the batch's commits.
//  6. Transience. Failures of the database (connection lost, serialisation
//     or deadlock, shutdown) are returned as errors, never as verdicts; the
//     whole batch is then rolled back and may simply be retried.
//
// The batch costs a fixed handful of statements whatever its size, in two
// pipelined round trips: BEGIN, the lease lock and the reads of the heads of
// tasks this process has not cached; then one INSERT ... SELECT FROM
// unnest(...) for the commits, one for the rejections, and COMMIT. A lookup
// of the stored rows that events at or below their head may collide with
// (usually none) takes a third. COMMIT travels with the insert, so the
// insert itself must fail when a row does not pass the fence (a lease that
// expired after it was read): ledger.fence_check (migration 00003) compares
// the rows inserted with the rows planned and raises, which aborts the
// transaction, and the batch runs again.
//
// The lookups are optimistic. An event planned as head + 1 is not looked up;
// if its id or (task, version) is in fact taken (an id reused under another
// task, a head another process moved on), the INSERT fails on the unique
// index and the batch is rerun with every head read from the database and
// every event looked up. An event that will not commit is never decided
// without that full lookup, so a cached head or a skipped lookup can cost a
// retry, never a wrong verdict. A cached head is never above the truth: it
// is written only after a commit, and heads only rise.
package fence
