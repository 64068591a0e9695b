// Package projector is the projector service: it consumes the committed log
// (LEDGER_LOG), rebuilds each task's state with the ordering engine of
// pkg/projection, and keeps it in the KV bucket ledger_tasks. Versions it
// misses are read back from PostgreSQL; it never skips one.
//
// The package reads in the order of a message's way through it:
//
//   - service.go: New, Start, Stop.
//   - consumer.go: the streams, buckets and the durable consumer it binds.
//   - turn.go: the loop that takes batches, decodes and offers them, and
//     settles them.
//   - gaps.go: re-fetches from PostgreSQL, and the open-gap markers.
//   - store.go: reading and writing the bucket; writefault.go: what a
//     refused write means.
//   - rebuild.go: a replay of the PostgreSQL log.
//
// One goroutine owns the engine. Each turn takes a batch of log messages and
// offers them, loading a task's stored value from the bucket the first time
// it is seen. It answers due re-fetches with one query and writes every
// changed state with compare-and-set on the key's revision. Only then does
// it settle the batch. So a crash loses nothing. An unacked message is
// redelivered. An acked one is applied in the bucket, or, if it was waiting
// for an earlier version, recorded as the task's gap, which a restarted
// projector fills from PostgreSQL. Tests:
// TestProjectorKilledDuringAGapRestartsRight,
// TestOutOfOrderDuplicatedAndMissingVersionsEndRight.
//
// A task gets one bucket write a turn, however many of its versions the
// turn holds (TestATurnWritesEachTaskOnce). A projector that is behind (a
// turn found a whole batch waiting) takes up to CatchUpBatchSize messages a
// turn, so a backlog costs fewer writes than events
// (TestCatchUpTurnsWriteATaskOnceForSeveralVersions).
//
// A message is not acked when its effect could not be stored:
//
//   - If the task's stored value cannot be read, the message is nak'ed and
//     comes back later; the rest of the batch goes on. Test:
//     TestEventWhoseProjectionCannotBeReadIsRedelivered.
//   - If the bucket refuses a task's state for lack of space, the task is
//     held. Its state is written again later, with backoff, and the message
//     of its newest version stays unacked until then. An older one is acked:
//     the newest alone makes a restarted projector catch the task up. Other
//     tasks keep flowing. Test:
//     TestFullBucketHoldsTheTaskItRefusesAndOthersFlow.
//   - A transient failure (a timeout, the connection) is retried, and the
//     batch waits for it.
//
// A message that is not a log copy of the contract (wire.Subjects.DecodeLog)
// is terminated and logged: only the ingest publishes to the log, and a
// redelivery would not make it readable. Test:
// TestUndecodableLogCopyIsTerminatedAndTheLogFlows.
//
// A state whose data does not fit in a bucket value is stored without it
// (data null, data_too_large its size; docs/contract.md §6). The engine
// keeps the true data; loading such a value folds it again from PostgreSQL.
// Test: TestProjectionTooLargeForAValueIsStoredWithoutItsData.
//
// With Deps.Primary, PostgreSQL is read only on the newest primary the
// ingests recorded (primary.go). Test:
// TestProjectorStopsReadingASupersededPrimary.
package projector
