// Package ingest is the ingest service: it takes generation-tagged events
// from its inboxes, commits them with the fenced append, stores
// the committed copies in LEDGER_LOG and the rejected ones in LEDGER_DLQ,
// sends each holder its receipts, and only then acks.
// It also serves the lease micro service of docs/contract.md §1.
//
// Each partition's events are decided by one ingest process at a time
// (claims.go). It claims the partition in PostgreSQL and consumes it in
// stream order, through a consumer of its own. It appends under the claim,
// so an ingest that lost the partition commits nothing for it. Tests:
// TestPartitionsSpreadOverIngestsAndMoveWhenOneStops,
// TestTwoIngestProcessesProduceTheSameLogAsOne; the fence's own
// TestWithoutTheClaimCheckALostIngestCommits is the negative control. A
// consumer that vanishes from the server is made again on a later beat
// (revive.go). Test: TestAPartitionsVanishedConsumerIsMadeAgain, switch
// NoRevive.
//
// Faults are never verdicts. The rules that make it so, each with the test
// that proves it:
//
//   - A message in hand is kept alive. Every message this process was handed
//     gets a progress ack every AckWait/3 until it is acked or handed back.
//     A full lane stops its partition's delivery. Only a process that stops
//     (killed, paused, cut off) lets its partitions go, when its claims
//     expire; the new owner's consumer starts at the oldest message left.
//     Test: TestStalledIngestKeepsItsMessagesAndEveryEventGetsOneVerdict.
//   - An event ahead of its head waits in its lane (park.go) and is offered
//     again when the version before it commits. A gap verdict waits for the
//     task's earlier messages: it comes only after the event's gap window
//     (from its arrival in its inbox) and only if no inbox holds an earlier
//     message on its subject. Tests:
//     TestOutOfOrderVersionIsCommittedAfterItsPredecessor,
//     TestCrashedIngestsPredecessorIsNotTurnedIntoGap.
//   - Failures of PostgreSQL or NATS are retried with backoff, the batch
//     kept in hand; they never produce a verdict. Test:
//     TestDatabaseOutageDelaysButNeverMisjudges.
//   - One event id has one final verdict: the fence makes a recorded
//     rejection final (pkg/fence), so a redelivered copy gets the same
//     verdict, or duplicate if it was committed. Test:
//     TestCrashAfterCommitBeforeAckLosesNothingAndWritesNothingTwice.
//   - A database that forgot acknowledged commits or grants commits
//     nothing (forgotten.go, witness.go). Tests:
//     TestNothingCommitsOnADatabaseThatForgotAcknowledgedCommits, switch
//     TestHooks.NoMemoryCheck;
//     TestGenerationIsNeverGrantedTwiceAfterTheDatabaseForgets, switch
//     TestHooks.NoWitness.
//
// LEDGER_LOG holds a task's copies in version order (order.go). A lane
// stores a version only after the one before: its own earlier copy, or
// one it looked up and put back from PostgreSQL. Each copy names the
// stream sequence of the copy before it, so a stream that lost that one
// without a reconnect (an R3 replica with a lost tail leading) refuses it
// and the lane puts the lost versions back first. Tests:
// TestACopyWhosePredecessorTheStreamLostWaitsForItsPutBack (switch
// TestHooks.NoLogExpectations),
// TestALaterVersionInTheBatchIsNotStoredPastARefusedCopy (switch
// TestHooks.OneRound).
//
// A batch message carries several events of one partition (batch.go).
// Each is decided as the single-event message it stands for, and the
// message is acked once every event in it is. Tests:
// TestBatchEventsGetTheVerdictsTheyWouldGetAlone (switch
// TestHooks.NoBatchDecode), TestBatchInADeadIngestIsRedeliveredAndDelaysTheGap
// (switch TestHooks.BatchAckOnReceive),
// TestEarlierBatchOfThePartitionDelaysTheGap (switch noBatchGapCheck).
//
// A task head request may list up to 1000 verdict lookups (leases.go). It
// counts once against the principal's fair share and costs one database
// round trip; each lookup is answered as it is alone. Tests: the fence's
// TestVerdictOfAnEventIsWhatTheLedgerRecorded, FuzzVerdictLookups, and
// TestWorkerFallsBackToSingleLookupsOnAnIngestWithoutBatches
// (TestHooks.NoLookupBatches plays an older ingest).
//
// Hostile input is bounded, so no single message or principal can stop the
// service for anyone else. Headers over wire.MaxHeaderBytes are invalid,
// and a dead letter always fits LEDGER_DLQ. A version more than MaxAhead
// ahead is judged at once. At most MaxWaitingPerPrincipal of a principal's
// events wait in memory; the rest go back to LEDGER_IN for later. Tests:
// TestOversizedMessagesGetDeadLettersThatFit,
// TestGapFloodIsBoundedAndJudgesNothing,
// TestOnePrincipalsDeadLettersStayWithinItsQuota.
//
// With an inbox stream per principal (inboxes.go), one principal's events
// fill only its own share, and its flood waits in its own stream and
// lanes, never in front of another principal's events. Tests:
// TestOnePrincipalsFullInboxLeavesAnotherCommitting,
// TestFloodOfOnePrincipalsInboxLeavesAnothersCommits and, with the
// projector folding the flood's commits,
// TestFloodOfOnePrincipalsCommitsLeavesAnothersProjections (switch for
// both: one shared LEDGER_IN),
// TestEarlierVersionInAnotherPrincipalsInboxDelaysTheGap.
package ingest
