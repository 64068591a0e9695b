// Package worker is the Go SDK of a worker that writes to the ledger: it
// acquires a partition's lease and keeps it alive, learns the heads of its
// tasks and assigns their versions, publishes events with the contract's
// headers and ULID ids (asynchronously, bounded), exposes each event's
// receipt, and reports the loss of the lease. It speaks only the public
// contract (CONTRACT.md): the lease micro service, LEDGER_IN and the
// holder's receipt subject.
//
//	holder := "reports.pod-7" // <principal>.<instance>
//	nc, err := nats.Connect(url, worker.InboxOption(holder)) // and the principal's credentials
//	c, err := worker.New(nc, worker.Config{Holder: holder})
//	defer c.Close()
//	lease, err := c.Acquire(ctx, c.PartitionOf("report-7"))
//	p, err := lease.Publish(lease.Context(), "report-7", "running", []byte(`{"pct":10}`))
//	err = p.Wait(ctx)            // nil once committed in Postgres
//	err = lease.Release(ctx)     // after every event has its receipt
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
// The request is sent before the database serves it, so the database's
// "now" is later than the send time and its expiry is later than send time
// + TTL. The margin covers the two clocks running at slightly different
// rates over one TTL (real drift is parts per million; 2% is generous) and
// a timer that fires a little late. Hence the local deadline always comes
// no later than the database expiry.
//
// A takeover by another holder is a compare-and-swap that succeeds only
// after the database expiry (CONTRACT §8), and that holder's first event
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
// reach the ledger after a takeover, and the fence (CONTRACT §8) refuses it
// as stale. None commits after a takeover.
//
// # Versions
//
// On the lease's first event of a task, Publish asks the ledger for the
// task's head (<prefix>.task.head); a task pinned to another partition is
// refused with ErrWrongPartition before anything is sent. Later events get
// head+1, head+2, ... assigned locally, in Publish order per task. An
// event refused with invalid, conflict or gap leaves a hole the ledger will
// not fill, so the events after it cannot commit (they wait as "not yet",
// then get gap when the gap window closes): Publish then fails for that
// task with ErrResyncNeeded until Lease.ResyncTask learns the head again.
//
// # Publishing and in-flight events
//
// Publish sends the event to <prefix>.in.<principal>.<instance>.<partition>.<task>
// with Nats-Msg-Id (a new ULID), Ledger-Generation, Ledger-Version and
// Ledger-Type, and returns at once with a Pending. At most
// Config.MaxInFlight events of a lease are published without a receipt;
// Publish blocks (bounded by its ctx) while that many are. A publish whose
// JetStream ack fails or times out is sent again with the same id while the
// lease lasts (deduplicated by JetStream within its window, and by the
// ledger by event id after it); nothing is sent after the lease ended.
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
