// Package fencecheck is the check a downstream service embeds to refuse a
// superseded ledger holder: the storage-side fencing-token check.
//
// A worker's lease has a fence (wire.Fence: partition, holder, generation),
// and a later holder of the partition always has a higher generation. A
// downstream service that remembers the highest generation it has seen per
// (resource, partition) can refuse a write of a lower one: that write comes
// from a holder that was paused or cut off and has since been replaced.
//
//	worker ──Ledger-Fence: 3:pay.a:7──▶ Middleware ──▶ Store.Admit ──▶ handler's write
//	zombie ──Ledger-Fence: 3:pay.z:6──▶ Middleware ──▶ 409 superseded
//
// Rules, and where each is kept:
//
//   - A generation below the highest seen for (resource, partition) is
//     refused (ErrSuperseded): ledger_fence.admit in fencecheck.sql, and
//     MemoryStore.Admit.
//   - The same generation under another holder is refused (ErrHolderMismatch):
//     a generation names one holder.
//   - The check and the write commit together: Admit runs in the caller's
//     transaction, and a refused or failed write leaves no trace of its
//     generation.
//   - Concurrent writers of one (resource, partition) are serialised: the
//     admit locks that row until the transaction ends (MemoryStore: a lock
//     per key until Finish).
//   - A service only knows what it has seen. A superseded holder that writes
//     before its successor's first write is admitted. The ledger's leases
//     view (bucket ledger_leases) tells such a service sooner (FollowLeases);
//     it is an optimisation, never the guarantee.
//
// Effects run from the ledger's committed log (package
// github.com/flowness/ledger/pkg/worker/effect) are fenced by the ledger
// itself; deduplicate them by their idempotency key, not by this check.
package fencecheck
