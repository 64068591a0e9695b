// Package fence is the ledger's storage core on PostgreSQL: partition
// leases with generation fencing tokens, and the fenced append of
// generation-tagged events.
//
// A worker holds a partition's lease and tags each event with the lease's
// holder and generation. Append commits an event only while that lease is
// still the partition's current one. A takeover raises the generation, so a
// worker that lost its lease cannot write once the next holder has begun.
// The database clock decides expiry, never a client's clock.
//
// # Lease states
//
//	                 Acquire: generation 1
//	never leased ───────────────────────────▶ held (holder h, generation g)
//	                                            │   ▲    │ Renew: later expiry
//	                  TTL passes, or Release    │   │    └───────▶ held
//	                                            ▼   │ Acquire, TakeOver: g+1
//	                                          expired (g kept)
//
// Acquire on a valid lease of another holder fails with ErrHeld. The same
// holder re-acquiring gets g+1 at once, which fences its own earlier self.
// Renew and Release succeed only for the current holder and generation of
// an unexpired lease; otherwise they fail with ErrLost. TakeOver is a
// compare-and-swap on the generation the taker observed: of many takers,
// one wins. A revoke raises the generation and grants it to nobody, and a
// cordoned partition is granted to nobody (operator.go).
//
// # The append
//
// Append decides a batch in one transaction. Each event gets one Result,
// checked in the contract's order: invalid, duplicate, stale, conflict, not
// yet (gap once its window closed), committed. The mechanics sit beside
// their code: lock modes (sql.go), round trips (appendsql.go, fast.go),
// the head cache (heads.go), the archive (archive.go).
//
// # Invariants
//
// Each rule names where it is enforced and the test that proves it. A
// switch is the seam in export_test.go that the test's negative control
// turns on; with it, the test fails.
//
//   - Fence. An event of generation g commits only while its lease row shows
//     its holder, g, and an expiry later than the insert's clock. Enforced by
//     the WHERE of sqlAppendInsert and ledger.fence_check (migration 00003).
//     Test: TestCommitOrderRace, switch Unfenced.
//   - Commit order. Every event of generation g commits before the grant of
//     g+1. Appends hold the lease row FOR KEY SHARE until commit, and a
//     takeover takes it FOR UPDATE (sql.go). Tests: TestCommitOrderRace,
//     switch Unfenced; TestAppendDoesNotBlockRenewButBlocksTakeover.
//   - Dense versions. A task's versions are 1, 2, 3, ... with no hole and
//     none twice, archived ones included; a snapshot task's only rise (else
//     conflict/overtaken). The insert moves a head only from the version it
//     planned from. Tests: TestWritersRacingOnOneTaskAreSerialised, switch
//     UnserialisedHeads; TestArchivedVersionsStayTaken, switch HeadsFromLog.
//   - Idempotence. A committed event id, or (task, version), sent again with
//     the same content is a duplicate with the original seq. Other content
//     is a conflict, recorded. Content compares as jsonb does (classify.go).
//     Tests: TestDuplicatesConflictsAndOrdering;
//     TestArchivedIDNeverCommitsAgain, switch WithoutIDFloor.
//   - Pinning. A task keeps the partition and kind of its first commit (else
//     wrong_partition, wrong_kind). It belongs to the principal of that
//     version's holder unless Config.SharedTasks (else not_owner). Enforced
//     in classify.go. Tests: TestAnotherPrincipalCannotWriteATask, whose
//     SharedTasks case is the control; TestTaskKindCannotChange.
//   - Finality. Stale, conflict and gap verdicts are written to
//     ledger.rejections in the batch's own transaction. An event id has one
//     final verdict; committed wins. A later copy gets the recorded verdict
//     again (Result.Repeat) and writes nothing. A rejection that another
//     append could undo is decided under FOR UPDATE lease locks
//     (plan.undoable). Tests: TestRecordedRejectionIsFinal;
//     TestConcurrentRejectionAndCommitOfOneEventID, switch
//     SharedRejectionLocks; TestStaleVerdictsDoNotHoldUpTheHoldersCommits,
//     switch AllRejectionsExclusive.
//   - Bounded payloads. A payload that jsonb cannot store, or would render
//     much larger than written, is invalid (bad_payload) before any SQL runs
//     (payload.go, one linear scan). Test: TestNumbersThatRenderHugeAreInvalid.
//   - Transience. A failure of the database is an error, never a verdict,
//     and the batch may be retried (IsTransient). A data error caused by one
//     event makes that event invalid, and the rest commits (isolate in
//     appendsql.go). Tests: TestAppendGivesNoVerdictWithoutDatabase,
//     TestDataErrorOfOneEventMakesItInvalidAndCommitsTheRest.
//   - Bounded locks. No silent client keeps lease rows locked for long. Each
//     transaction sets statement and idle timeouts (sqlSetTimeouts), and each
//     attempt has a deadline of its own (Config.AttemptTimeout). Tests:
//     TestSilentConnectionDoesNotHoldTheLeaseLocked,
//     TestAppendOnASilentConnectionGivesUpAndTheNextCommits.
//   - Claims. An ingest that lost its claim on a partition commits nothing
//     for it (claims.go). Tests: TestIngestThatLostItsClaimCommitsNothing;
//     TestWithoutTheClaimCheckALostIngestCommits, switch WithoutClaimCheck.
//   - One verdict, either path. The one-round-trip path decides as the
//     careful path does, and a miss costs a retry, never a wrong verdict
//     (fast.go). Test: TestFastPathDecidesAsTheCarefulPath.
//   - Growth. An append's cost does not grow with the ledger's age, and an
//     archived id never commits again (archive.go). Tests:
//     TestAppendRacingAnArchiveDoesNotCommitAnArchivedID, switch
//     WithoutIDFloor; TestArchiveWaitsForRowsStillBeingWritten and
//     TestArchiveChecksItsFilesBeforeItDrops, switch ArchiveSeams;
//     TestAppendsMakePartitionsAheadOfNeed, switch WithoutPartitionKeeping.
//   - The operator's fence. A revoked holder's next write is stale, and a
//     cordoned partition is granted to nobody (operator.go, migration
//     00014). Tests: TestRevokedHoldersNextWriteIsStaleWithoutWaitingForTheTTL,
//     TestCordonedPartitionIsGrantedToNobodyUntilUncordoned.
//   - Observe mode. A partition in observe mode commits what the fence
//     would refuse and marks it WouldReject (modes.go, migration 00015).
//     Test: TestObserveModeCommitsWhatEnforceWouldRefuseAndSaysSo.
//   - The database's own fence. PostgreSQL refuses, to every role but the
//     schema's owner, what the fence refuses (migrations 00012, 00018), and
//     a rejection the fence would not give (00017). Its refusal is an error
//     of the fence's own SQLSTATE, never a verdict. Tests:
//     TestIngestRoleCannotBypassTheFence,
//     TestIngestRoleCannotRecordAFalseRejection (internal/deploytest).
//   - Partition ranges. Where an operator set ranges, a grant lies within
//     the grantee's (00017, every role). Test:
//     TestPrincipalLeasesOnlyItsPartitionRanges.
//   - The newest primary. With Config.Primary nothing is written on an
//     older WAL timeline than the newest known, nor on a newer one before
//     the guard's witness recorded it (primary.go). Tests: timeline_test.go,
//     TestGuardedPoolRefusesAnOlderTimeline.
package fence
