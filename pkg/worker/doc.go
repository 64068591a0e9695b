// Package worker is the Go SDK of a worker that writes to the ledger: it
// acquires a partition's lease and keeps it alive, learns the heads of its
// tasks and assigns their versions, publishes events with the contract's
// headers and ULID ids (asynchronously, bounded), exposes each event's
// receipt, and reports the loss of the lease. It speaks only the public
// contract (docs/contract.md in the repository): the lease micro service,
// LEDGER_IN and the holder's receipt subject. Its module needs nothing but
// nats.go, ulid and the contract's codec (pkg/wire).
//
//	holder := "reports.pod-7" // <principal>.<instance>
//	nc, err := nats.Connect(url, worker.InboxOption(holder)) // and the principal's credentials
//	c, err := worker.New(nc, worker.Config{Holder: holder}) // asks the service for the partition count
//	defer c.Close()
//	lease, err := c.Acquire(ctx, c.PartitionOf("report-7")) // AcquireWait to stand by instead
//	p, err := lease.PublishJSON(lease.Context(), "report-7", "running", map[string]int{"pct": 10})
//	err = p.Wait(ctx)            // your context, not the lease's: nil once committed in Postgres
//	err = lease.Release(ctx)     // after every event has its receipt
//
// examples/standby in the repository is a whole primary/standby worker
// built on this package, and examples/watcher the read side; docs/sdk.md
// walks through both.
//
// # Leases and the local deadline
//
// The database clock decides when a lease expires: a grant or renewal sets
// expires_at = now() + TTL by the database's clock, at some moment while
// the request is being served. The client cannot read that clock, so it
// keeps its own, more pessimistic deadline:
//
//	local deadline = (monotonic time when the confirmed request was SENT) + TTL − margin
//	margin         = 2% of TTL + 25 ms
//
// (for an acquire sent more than once, when it was first sent: any later
// copy may have left after the grant was made)
//
// The request is sent before the database serves it, so the database's
// "now" is later than the send time and its expiry is later than send time
// + TTL. The margin covers the two clocks running at slightly different
// rates over one TTL (real drift is parts per million; 2% is generous) and
// a timer that fires a little late. Hence the local deadline always comes
// no later than the database expiry.
//
// A takeover by another holder is a compare-and-swap that succeeds only
// after the database expiry (docs/contract.md §8), and that holder's first event
// can commit only after its grant. (The same holder id acquiring again is
// granted at once: that is how a restarted process fences its earlier
// incarnation, which then learns of the loss from its next renewal or a
// stale receipt. So a holder id must name one live process.) So if a renewal is not confirmed by the
// local deadline, the client declares the lease lost at that deadline
// (Lease.Context is cancelled with a cause matching ErrLeaseLost, Lease.Lost
// is closed, Publish refuses), and this happens before any other holder
// could even be granted the partition, let alone commit under it. A client
// whose renewals stop reaching the service, for whatever reason (network
// cut, service down, process paused and resumed), thus learns of the loss
// in time without hearing from anyone.
//
// Renewals are sent every Config.RenewEvery (default TTL/3) and retried
// more often after a failure, each bounded by the local deadline. The lease
// is also lost at once when a renewal is refused (lost), and when an event
// of the lease comes back stale: the fence refused its generation, which
// can never hold again. Publish checks the local deadline itself, on the
// monotonic clock and on the wall clock (the monotonic clock stands still
// while the host is suspended, the wall clock does not), so even a late
// timer cannot let an event leave after it.
//
// Losing the lease locally does not undo what was sent: events published
// before the loss may still commit until the database expiry, and their
// receipts say so. The deadline is the worker's knowledge, not the
// guarantee: an event published just before the process was paused can
// reach the ledger after a takeover, and the fence (§8) refuses it
// as stale. None commits after a takeover.
//
// # Acquiring, and standing by
//
// Acquire sends one request with a request_id and sends it again, with the
// same id, while it is not answered and its context lasts: the service
// grants it once however many copies arrive (a retry of the grant that
// made the current generation gets that grant back), so a slow service
// never makes a holder fence itself. The local deadline counts from the
// first send, the only one known to precede the grant; a grant that comes
// so late that less than two thirds of its TTL is left is renewed before
// Acquire returns.
//
// AcquireWait is Acquire for a standby: while another holder's lease is
// valid it waits until that lease's expiry (plus 5 to 30 ms of jitter),
// polls <prefix>.lease.get every Config.StandbyPoll (default TTL/10) so a
// released lease is taken at once, and returns the lease or ctx's error. A
// primary/standby worker is a loop: AcquireWait, work while the lease's
// context lasts, and AcquireWait again after a loss; on SIGTERM it calls
// Release with a fresh context (the process's is done by then, the lease's
// ends with the lease), so a standby takes over within a poll instead of a
// TTL.
//
// # Resuming a task
//
// A new holder resumes each task from its head, read after the lease is
// acquired (before, the old holder may still move it): Client.TaskHead
// tells the task's last version and the type of its last event. Skip a
// task whose type is terminal for your work ("completed"); otherwise carry
// on: Publish gives the lease's next event of the task version Version+1.
// The projection (KV ledger_tasks) folds payloads as JSON merge patches, so
// a field an old holder set persists unless the new one sets it to null.
//
// # What a paused, cut-off or slow worker sees
//
// A worker paused (SIGSTOP, a long GC, a VM migration) or cut off past its
// local deadline finds, when it runs again, its lease's context done with a
// cause matching ErrLeaseLost, Lease.Lost closed, and Publish refusing: it
// sends nothing more under that generation. The only stale verdicts it can
// get are for events it sent before the pause that were still queued at
// the ledger (in LEDGER_IN, or in its own connection's buffer) when the
// partition was taken over: the fence refuses them, its receipt says
// stale/superseded, and Pending.Wait returns a *RejectedError, as long as
// you wait with a context of your own rather than the lease's. Nothing of
// the old generation commits after the takeover.
//
// A takeover waits for the fenced batch in flight on the partition to
// commit (docs/contract.md §8). With large events a batch takes longer: 500
// events of 64 KiB held a lease row long enough for acquires to time out
// before the ingest bounded a batch's bytes (-max-batch-bytes, default 4
// MiB). An acquire that times out is sent again with its request_id and
// granted once; if a takeover still waits longer than
// Config.RequestTimeout, lower -max-batch-bytes or -batch-size at the
// ingest, or raise RequestTimeout and the TTL together.
//
// # Versions
//
// On the lease's first event of a task, Publish does not wait for the
// task's head: the event queues on the task, and one lookup of
// <prefix>.task.head, asked together with every other new task's, learns
// it; the queued events then get head+1, head+2, ... in Publish order and
// leave. A task pinned to another partition sends nothing: its queued
// events end with ErrWrongPartition (Pending.Receipt), and later Publishes
// fail with it at once. Later events get their versions assigned locally,
// in Publish order per task. An
// event refused with invalid, conflict or gap leaves a hole the ledger will
// not fill, so the events after it cannot commit (they wait as "not yet",
// then get gap when the gap window closes): Publish then fails for that
// task with ErrResyncNeeded until Lease.ResyncTask learns the head again.
//
// # Publishing and in-flight events
//
// Publish sends the event to <prefix>.in.<principal>.<instance>.<partition>.<task>
// with Nats-Msg-Id (a new ULID and the content token, wire.ContentToken),
// Ledger-Generation, Ledger-Version and Ledger-Type, and returns at once
// with a Pending. At most Config.MaxInFlight events of a lease are
// published without a receipt; Publish blocks (bounded by its ctx) while
// that many are. A publish whose JetStream ack fails or times out is sent
// again with the same id while the lease lasts (deduplicated by JetStream
// within its window, and by the ledger by event id after it); nothing is
// sent after the lease ended.
//
// The client keeps every event until its verdict. When no receipt came
// within Config.ReceiptTimeout it asks the ledger for the verdict, with the
// event's content, so that committed is answered only for what the ledger
// stored. While the ledger has no record of the event (its LEDGER_IN
// message may have been lost by a JetStream server that crashed), the
// client publishes it again, same id and content, on the 1st, 2nd, 4th,
// 8th, ... such answer, while the lease lasts.
// Release refuses new events, waits until every in-flight event has its
// receipt, and only then releases the lease.
//
// # Signals and what each promises
//
// The success signal of an event is its commit receipt, durable in
// Postgres, not the JetStream publish ack: JetStream's file store syncs to
// disk only periodically (every two minutes by default), so on a single
// node an acked message can be lost by a power failure or kernel crash.
//
//	signal                       what it promises
//	---------------------------  -------------------------------------------------------------
//	Pending.PubAck               LEDGER_IN accepted and stored the event, replicated as the
//	                             stream is configured; on a single node not necessarily
//	                             fsynced yet. The event is not judged yet: it may still be
//	                             refused. Not a success signal.
//	receipt committed            the event is a row of ledger.events, committed in Postgres
//	(Pending.Wait == nil)        under the fence (its generation held the lease at commit);
//	                             its LEDGER_LOG copy is stored. This is THE success signal.
//	receipt duplicate            nothing new was written: the event id (same_event_id), or
//	(Pending.Wait == nil)        identical content at its version (same_content), was
//	                             committed earlier; seq is the original row's.
//	receipt stale                refused by the fence (superseded, not_holder,
//	                             lease_expired, no_lease): in LEDGER_DLQ and
//	                             ledger.rejections. The lease is lost.
//	receipt conflict, gap        refused: in LEDGER_DLQ and ledger.rejections.
//	receipt invalid              refused as malformed or wrong_partition: in LEDGER_DLQ only.
//	verdict looked up            the receipt was lost; the ledger's record stands in for it
//	(no receipt after            and promises the same (see below). Pending.Wait and
//	ReceiptTimeout)              Pending.Receipt return it like a receipt.
//	Lease.Context done,          the lease can no longer be trusted (cause ErrLeaseLost) or was
//	Lease.Lost closed            given up (ErrReleased, ErrClosed); stop the work it guarded.
//
// Receipts are sent on core NATS to <prefix>.receipt.<holder>: at least
// once in the normal flow (an ingest that crashed after committing sends a
// duplicate receipt when the event is redelivered), but a receipt is lost
// if it is sent while this client is disconnected. So when an event has no
// receipt Config.ReceiptTimeout (default 10 s) after its publish ack, the
// client asks the ledger for the verdict it recorded (<prefix>.task.head
// with the event id) and settles the event with it as its receipt would
// have: Pending.Done closes, the in-flight slot frees, Release and
// ResyncTask go on. A receipt that still arrives afterwards is ignored.
// Such a receipt carries what the ledger records: committed with the row's
// seq (also for what the lost receipt would have called a duplicate of the
// same event id), or stale, conflict or gap with its reason, and
// current_generation 0. Committed means what the committed receipt means,
// the row is in Postgres under the fence; its LEDGER_LOG copy is stored by
// the ingest before it lets go of the event, even across a crash.
//
// While the ledger has recorded nothing for the event (it still waits in
// LEDGER_IN, for example behind a missing version), the client asks again
// every ReceiptTimeout, one request at a time per event, until the verdict
// is there or the client is closed. Two verdicts record nothing under the
// event's id: invalid, and a duplicate of identical content committed under
// another id. An event whose receipt of either is lost stays pending;
// every wait on it is bounded by the caller's context, as always, and the
// DLQ or ledger.events tell the outcome.
package worker
