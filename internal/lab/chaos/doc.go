// Package chaos proves the ledger's promises under faults, continuously: it
// runs the real services as processes, breaks them while writers publish,
// and then checks, trusting nothing the services say about themselves,
// that no promise was broken ("ledgerlab chaos", "make chaos").
//
// # The run
//
// Run starts a throwaway PostgreSQL (package pgtemp, durable commits), one
// nats-server or three (RunNATS, each a "ledgerlab chaos nats" process),
// two ingests and a projector from their binaries, and two writers per
// partition (RunWriter, "ledgerlab chaos writer"), each the other's
// standby. While they publish it injects, on a seeded schedule: SIGSTOP of
// a lease holder past its TTL (it wakes as a zombie and keeps publishing
// with its old generation for a moment), kill -9 of an ingest, kill -9 of
// the nats-server (or of a cluster node), and an immediate-mode PostgreSQL
// restart. With Replication the database is a primary and a streaming
// standby on one multi-host URL, and the PostgreSQL fault is a failover
// instead: kill -9 of the primary and promotion of the standby, frozen
// behind first when replication is asynchronous, and with SplitBrain the
// old primary started again, writable (pgfailover.go). Then it stops the
// faults and the writers, waits until LEDGER_IN
// is empty and the projections caught up, and checks. Faults lists every
// kind of fault, one entry each: the flags, scheduler and summary read it.
//
// # The writers
//
// A writer acquires its partition's lease (on "held" it waits for the
// holder's expiry from the reply and asks again), reads the heads of its
// tasks, and publishes each task's next version in turn, the next one only
// once JetStream acked the previous (a send without an ack is retried with
// the same event id while the lease lasts). It renews every TTL/3 and
// stops trusting its generation at the Go SDK's local deadline, on a
// refused renewal, or on a stale receipt. Everything goes to its log as
// JSON lines (Record): each send just before it leaves, each ack, receipt,
// grant (with the time its reply arrived), refusal and loss. Events are
// published as raw JetStream messages with the contract's headers, so a
// zombie's sends bypass any client-side lease check.
//
// # Side effects
//
// Every event of type "checkpoint" is a side effect's intent
// (docs/side-effects.md). The run creates a downstream database next to
// the ledger's, with the fence check of pkg/fencecheck, and runs an effect
// runner (pkg/worker/effect) that applies each committed intent there,
// keyed by its event id. A writer also applies each intent it sends
// directly, with its fence, zombies included, and logs the outcome.
//
// # The checker
//
// Check reads only a History: the writers' logs, and the rows, stream
// messages and bucket values of the run's tasks (Collect). A send's time is
// its writer's clock, a grant's time the moment its reply reached its
// writer; writers run on one host, so the times compare. The violations it
// counts are the ViolationKind constants; each must be 0. The side-effect
// kinds read the downstream's rows: a direct effect of a partition applied
// after one of a higher generation (superseded_effects), and a committed
// intent without an applied effect (intents_without_effect).
//
// # The failover measurement
//
// RunFailover ("ledgerlab chaos failover", "make failover") reuses the run's
// processes for a measurement instead of a proof: per lease TTL, a stack of
// PostgreSQL, NATS and one ingest, and two writers of one partition without
// a zombie window, renewing as the Go SDK does. It kills the holder with
// SIGKILL and reads from PostgreSQL when the standby was granted the
// partition and when its first event committed, and it pauses the live
// holder with SIGSTOP and counts the pauses that cost it its lease.
package chaos
