// Package worker is the Go SDK of a worker that writes to the ledger. It
// acquires a partition's lease and keeps it alive, assigns the versions of
// its tasks, publishes events with the contract's headers and ULID ids,
// exposes each event's receipt, and reports the loss of the lease. It speaks
// only the public contract (docs/contract.md in the repository). Its module
// needs nothing but nats.go, ulid and the contract's codec (pkg/wire).
//
//	holder := "reports.pod-7" // <principal>.<instance>
//	nc, err := nats.Connect(url, worker.InboxOption(holder), // and the principal's credentials
//		nats.MaxReconnects(-1)) // for ever: a closed connection strands its events
//	c, err := worker.New(nc, worker.Config{Holder: holder}) // asks the service for the partition count
//	defer c.Close()
//	lease, err := c.Acquire(ctx, c.PartitionOf("report-7")) // AcquireWait to stand by instead
//	p, err := lease.PublishJSON(lease.Context(), "report-7", "running", map[string]int{"pct": 10})
//	err = p.Wait(ctx)            // your context, not the lease's: nil once committed in Postgres
//	err = lease.Release(ctx)     // after every event has its receipt
//
// docs/sdk.md walks through a primary/standby worker (examples/standby) and
// the read side (examples/watcher): resuming a task, what a paused worker
// sees, a slow ledger, the in-flight window.
//
// # A lease's life, as the client sees it
//
//	Acquire, AcquireWait ──▶ held ──Release──▶ releasing ──last receipt──▶ released
//	                          │  ▲
//	                          │  └── renewed every Config.RenewEvery (TTL/3)
//	                          ▼
//	                         lost: local deadline passed, renewal refused,
//	                               or an event came back stale
//
// A lost or released lease cancels Lease.Context with a cause matching
// ErrLeaseLost, ErrReleased or ErrClosed, and closes Lease.Lost. Publish
// refuses from then on. A holder id must name one live process: the same
// id acquiring again is granted the next generation and fences the first.
//
// # Rules
//
// Each rule names where it is kept and the test (in internal/sdktest) that
// proves it.
//
//   - The local deadline comes before the database's expiry. A client that
//     hears nothing declares the lease lost before another holder can be
//     granted it (lease.go, onDeadline). Tests:
//     TestWriterCutOffFromTheServiceLearnsItLostTheLeaseBeforeTheTakeoverCommits,
//     TestGrantWhoseReplyWasLostCountsItsDeadlineFromTheFirstSend.
//   - A refusal ends the lease at once: a renewal refused, or an event
//     stale, since its generation can never hold again (lease.go). Tests:
//     TestRenewalRefusedEndsTheLease, TestEventThatComesBackStaleEndsTheLease.
//   - An acquire is granted once however often it is sent: it carries a
//     request_id (lease.go, Acquire). Test:
//     TestAcquireThatTimedOutAndWasSentAgainIsGrantedOnceAndKept.
//   - A standby takes a released lease within a poll and an expired one at
//     its expiry (standby.go). Tests:
//     TestStandbyTakesOverAReleasedLeaseWithinAPoll,
//     TestStandbyTakesOverWhenThePrimarysLeaseExpires.
//   - A task's versions are assigned in Publish order, dense, from the head
//     the ledger reports (publish.go, heads.go). Tests:
//     TestConcurrentPublishersOfOneTaskGetDenseVersions,
//     TestNextLeaseContinuesTaskFromItsHead.
//   - An event refused as invalid, conflict or gap leaves a hole the ledger
//     will not fill. Publish on that task then fails with ErrResyncNeeded
//     until Lease.ResyncTask (publish.go). Test:
//     TestRefusedEventStopsItsTaskUntilResync.
//   - A task pinned to another partition sends nothing; its events end with
//     ErrWrongPartition. Test:
//     TestTaskPinnedToAnotherPartitionIsRefusedBeforePublishing.
//   - At most Config.MaxInFlight events of a lease wait for receipts;
//     Publish blocks for a slot (publish.go). Test:
//     TestPublishBlocksWhileMaxInFlightEventsAwaitReceipts.
//   - Every event gets its verdict. A lost receipt is looked up after
//     Config.ReceiptTimeout, and an event the ledger never saw is published
//     again, after its lease ended too, to be judged stale (client.go,
//     awaitVerdict). Every acknowledged event without a receipt is published
//     again after a reconnect (reconnect.go). Tests:
//     TestLostReceiptIsLearnedFromTheLedger,
//     TestEventLostFromLedgerInIsPublishedAgainAndCommitted,
//     TestEventLostAfterItsLeaseEndedIsJudgedStale,
//     TestEventLostFromLedgerInIsPublishedAgainOnReconnect.
//   - Lookups due together go in one request, up to Config.LookupBatchMax;
//     a ledger without the batch form is asked event by event (lookups.go).
//     Tests: TestThousandsOfLookupsGoInFewRequestsAndNoneIsRefused,
//     TestWorkerFallsBackToSingleLookupsOnAnIngestWithoutBatches.
//   - A lease's events published within Config.BatchLinger leave in one
//     batch message, each kept to its own verdict; a batch whose publish
//     fails is sent again event by event, and a LEDGER_IN without batch
//     subjects turns batches off (batch.go). Tests:
//     TestEventsOfALeaseLeaveInBatchesAndEachIsCommitted,
//     TestClientFallsBackToSingleEventsWhenTheInboxTakesNoBatches,
//     TestLostBatchIsRecoveredEventByEvent.
//   - Release returns only after every in-flight event has its receipt.
//     Tests: TestEventsCommitAndReleaseWaitsForTheirReceipts,
//     TestReleaseReturnsAfterALostReceipt.
//
// # Signals and what each promises
//
// The success signal of an event is its commit receipt, durable in
// Postgres. The JetStream publish ack is not: JetStream's file store syncs
// to disk only every two minutes by default.
//
//	signal                       what it promises
//	---------------------------  -------------------------------------------------------------
//	Pending.PubAck               LEDGER_IN stored the event, not yet judged. Not success.
//	receipt committed            a row of ledger.events, committed under the fence; its
//	(Pending.Wait == nil)        LEDGER_LOG copy is stored. THE success signal.
//	receipt duplicate            nothing new written: the id (same_event_id) or identical
//	(Pending.Wait == nil)        content at its version (same_content) committed earlier.
//	receipt stale                refused by the fence; in LEDGER_DLQ and ledger.rejections.
//	                             The lease is lost.
//	receipt conflict, gap        refused; in LEDGER_DLQ and ledger.rejections.
//	receipt invalid              refused as malformed or wrong_partition; in LEDGER_DLQ only.
//	verdict looked up            the receipt was lost; the ledger's record stands in for it
//	                             and promises the same.
//	Lease.Context done,          the lease can no longer be trusted (ErrLeaseLost) or was
//	Lease.Lost closed            given up (ErrReleased, ErrClosed): stop the work it guarded.
package worker
