// Package effect runs a worker's side effects from the ledger's committed
// log, so that only what was committed under a valid fence acts outside the
// ledger.
//
// A worker records the intent of a side effect (charge a card, send a mail)
// as an event of its own type, published through its lease like any other.
// The ledger's fence refuses the intent of a superseded holder (stale), so
// such an intent never reaches LEDGER_LOG. A Runner consumes LEDGER_LOG,
// picks the events of the chosen types and calls a Handler for each.
//
//	worker (lease) ──intent──▶ LEDGER_IN ──fence──▶ LEDGER_LOG ──▶ Runner ──▶ Handler ──▶ downstream
//	zombie (stale) ──intent──▶ LEDGER_IN ──fence──▶ LEDGER_DLQ   (never runs)
//
// Rules, and where each is kept:
//
//   - Only committed intents run: the Runner reads nothing but LEDGER_LOG,
//     which carries only committed events (docs/contract.md §4).
//   - At least once: a message is acked only after its Handler returned nil
//     and the server confirmed the ack (Runner.handle). A Handler error, a
//     crash or a pause before the ack gets the effect delivered again.
//   - The idempotency key is the event id (Effect.ID): every delivery of one
//     intent, on any runner, carries the same key.
//   - Progress is durable: a JetStream durable consumer of the Runner's own
//     (effects-<Config.Name>) remembers what was acked, across restarts.
//   - One active runner per consumer: the consumer uses a priority group
//     with the pinned_client policy (nats-server 2.11 or later). The server
//     delivers to one pinned runner; the others stand by with their pull
//     requests waiting, and one of them is pinned once the active runner has
//     pulled nothing for Config.PinnedTTL. Split the work by partition
//     (Config.Partitions) or by type (Config.Types) with one Name per split.
//
// # What "exactly once" can and cannot mean
//
// No runner can make an effect on another system happen exactly once by
// itself: it can crash after the downstream applied the effect and before
// its own ack is stored, and then it must call again. What the ledger and
// the Runner give is at-least-once delivery with a stable key. Exactly-once
// effect is the downstream's part. The Handler passes Effect.ID downstream
// (an Idempotency-Key header, a unique column), and the downstream applies
// a key once and answers a repeated key as it did the first time. A
// downstream that cannot deduplicate gets the effect at least once.
//
// A pinned runner that is paused (not dead) past PinnedTTL may wake up and
// finish a handler call that another runner also makes: the key makes that
// harmless too. The fence of an intent (Effect.Fence) tells who decided it;
// it is not a reason to refuse the effect downstream, because a committed
// intent stays valid after its holder is superseded. Direct calls of a
// holder (not from the log) are the ones a downstream fences (package
// fencecheck in the repository; docs/side-effects.md).
package effect
