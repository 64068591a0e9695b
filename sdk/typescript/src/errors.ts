import type { ErrorReply, OperatorAction, Receipt } from "./wire.js";

/**
 * ErrorCode says what went wrong, for callers to branch on (err.code):
 *
 * - HELD, LOST, NO_LEASE, INVALID, UNAVAILABLE: the lease service said so
 *   (a ServiceError), or the SDK found the request malformed (INVALID) or the
 *   service unreachable (UNAVAILABLE) before it answered; a refusal of a
 *   principal over its share (busy, rate_limited: see err.error) is UNAVAILABLE;
 * - LEASE_LOST: the lease ended without release (a refused renewal, no renewal
 *   confirmed by the local deadline, a stale receipt);
 * - RELEASED, CLOSED: the lease was given up by release() or Client.close();
 * - LEASE_ACTIVE: this client already holds the partition;
 * - WRONG_PARTITION: the task is pinned to another partition;
 * - RESYNC_NEEDED: an earlier event of the task was refused; call resyncTask;
 * - NOT_SENT: the caller's signal ended before the event left;
 * - REJECTED: an event's verdict is not a success (a RejectedError).
 */
export type ErrorCode =
  | "HELD"
  | "LOST"
  | "NO_LEASE"
  | "INVALID"
  | "UNAVAILABLE"
  | "LEASE_LOST"
  | "RELEASED"
  | "CLOSED"
  | "LEASE_ACTIVE"
  | "WRONG_PARTITION"
  | "RESYNC_NEEDED"
  | "NOT_SENT"
  | "REJECTED";

/** LedgerError is every error the SDK gives; code tells which. */
export class LedgerError extends Error {
  override name = "LedgerError";
  constructor(
    readonly code: ErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

const SERVICE_CODES: Record<string, ErrorCode> = {
  held: "HELD",
  lost: "LOST",
  no_lease: "NO_LEASE",
  invalid: "INVALID",
  unavailable: "UNAVAILABLE",
  // A principal over its share of the service: nothing was done, and every
  // loop that retries an unavailable service backs off and tries again.
  busy: "UNAVAILABLE",
  rate_limited: "UNAVAILABLE",
};

/**
 * ServiceError is an error reply of the lease service, carrying the current
 * lease where the service knew it. An unknown reply code counts as INVALID.
 */
export class ServiceError extends LedgerError {
  override name = "ServiceError";
  /** The reply's "error": held, lost, no_lease, invalid, unavailable, busy or rate_limited. */
  readonly error: string;
  readonly holder?: string;
  readonly generation?: number;
  readonly expiresAt?: Date;
  /** The deployment's partition count, told by a get's no_lease reply. */
  readonly partitions?: number;
  /** Set on a lost reply when an operator revoked the lease: who, why and when. */
  readonly revoked?: OperatorAction;
  /** Set on a held reply when an operator cordoned the partition. */
  readonly cordoned?: OperatorAction;
  constructor(reply: ErrorReply) {
    super(SERVICE_CODES[reply.error] ?? "INVALID", `ledger: lease service: ${reply.error}: ${reply.message}`);
    this.error = reply.error;
    this.holder = reply.holder;
    this.generation = reply.generation;
    this.expiresAt = reply.expires_at ? new Date(reply.expires_at) : undefined;
    this.partitions = reply.partitions;
    this.revoked = reply.revoked;
    this.cordoned = reply.cordoned;
  }
}

/** RejectedError is Pending.wait()'s error for a verdict that is not a success. */
export class RejectedError extends LedgerError {
  override name = "RejectedError";
  readonly verdict: Receipt["verdict"];
  readonly reason: string;
  constructor(readonly receipt: Receipt) {
    super(
      "REJECTED",
      `ledger: event ${receipt.event_id} (task ${receipt.task}, version ${receipt.version}) rejected: ${receipt.verdict}/${receipt.reason}`,
    );
    this.verdict = receipt.verdict;
    this.reason = receipt.reason;
  }
}
