// Package projection is the per-task ordering engine behind the ledger_tasks
// KV bucket (docs/contract.md §6). It turns the committed log, as a consumer
// sees it (out of order, duplicated, with holes), into one State per task
// that is the fold of the task's events in version order.
//
// It is pure: no I/O, no goroutines, no clock of its own (Config.Now), and it
// imports nothing else of the project. Its owner, the projector service,
// feeds it events with Engine.Offer, writes Result.State to KV whenever
// Result.Changed, seeds tasks from KV with Engine.Load, and answers
// Engine.DueRefetches by reading versions from Postgres and offering them
// through the same Offer.
//
// # Invariants
//
//   - Strict order. Versions are applied one at a time, 1, 2, 3…: the Reducer
//     only ever sees version head+1. A later version that arrives early waits
//     in a buffer and is applied as soon as the versions before it are.
//   - No skip. The engine never moves past a missing version. It reports
//     the gap (State.Gap) and, after Config.GapTimeout measured on its own
//     clock from when it began waiting at that version, asks the owner to
//     re-fetch it (Refetch). Requests for the same task are spaced by
//     GapTimeout, and progress restarts the clock.
//   - Idempotence. Offering an event again, from a redelivery or a
//     re-fetch, changes nothing once it is applied or buffered.
//   - Duplicate versus conflict. Content is the event's type and its
//     payload compared as JSON values (key order, whitespace, escapes and
//     number spelling do not matter, as with jsonb). A version repeated with
//     the same content is OutcomeDuplicate; with different content it is
//     OutcomeConflict (ErrConflict): reported and never applied; the copy
//     seen first stands. Each task remembers a fingerprint of its last
//     Config.DedupWindow applied versions; a repeat of an older version, or
//     of one applied before Load, cannot be judged and is OutcomeUnverified,
//     which also changes nothing. Buffered versions are judged against the
//     buffered copy.
//   - Bounded memory. Buffers are capped per task (Config.MaxBufferedPerTask)
//     and in total (Config.MaxBuffered, Config.MaxBufferedBytes). When an
//     event does not fit, the engine drops that task's buffer and the event
//     (OutcomeDeferred) and puts the task into catch-up: it is due at once
//     for a Refetch with CatchUp set, a read of every version after its head.
//     It buffers nothing for that task until its head reaches the highest
//     version it dropped, and asks again every GapTimeout until then, so
//     every dropped event is re-read; nothing is dropped silently. Tasks that
//     are caught up can be evicted (Engine.Evict, Engine.Trim) and loaded
//     again from KV.
//   - Damaged input is repaired, not skipped. An event whose payload is not
//     JSON, or that the Reducer rejects, is not applied; if the task still
//     needs that version it goes into catch-up, so the version is read again
//     from the database.
//
// A State's Gap is nil, or reports the next version, how many later versions
// are buffered and since when the task waits (Buffered is 0 during a
// catch-up).
package projection
