import { contentToken } from "./ulid.js";

// The contract's names and rules (docs/contract.md), as the Go pkg/wire has them.

/** PREFIX_DEFAULT is the subject prefix of a deployment that sets none. */
export const PREFIX_DEFAULT = "ledger";
/** BUCKET_TASKS is the KV bucket holding one projection per task. */
export const BUCKET_TASKS = "ledger_tasks";
/** TTL_MIN_MS and TTL_MAX_MS bound a lease's ttl_ms. */
export const TTL_MIN_MS = 100;
export const TTL_MAX_MS = 300_000;
/** MAX_PAYLOAD_DEFAULT is the ledger's default payload limit: 256 KiB. */
export const MAX_PAYLOAD_DEFAULT = 256 << 10;
/** MAX_BATCH is the most events one batch message carries (contract §2, "Batches"). */
export const MAX_BATCH = 1000;
/** HEADER_BATCH counts the events of a batch message, and the receipts of a batched receipt. */
export const HEADER_BATCH = "Ledger-Batch";

const ID = /^[A-Za-z0-9_-]{1,128}$/;
const TOKEN64 = /^[A-Za-z0-9_-]{1,64}$/;
const TYPE = /^[A-Za-z0-9_.:-]{1,64}$/;

/** validTask says whether s is a task id: 1..128 of [A-Za-z0-9_-]. */
export function validTask(s: string): boolean {
  return typeof s === "string" && ID.test(s);
}

/** validHolder says whether s is <principal>.<instance>, each 1..64 of [A-Za-z0-9_-]. */
export function validHolder(s: string): boolean {
  if (typeof s !== "string") return false;
  const parts = s.split(".");
  return parts.length === 2 && TOKEN64.test(parts[0]!) && TOKEN64.test(parts[1]!);
}

/** validType says whether s is an event type: 1..64 of [A-Za-z0-9_.:-]. */
export function validType(s: string): boolean {
  return typeof s === "string" && TYPE.test(s);
}

/** principalOf is the part of a holder id before the dot: the NATS user. */
export function principalOf(holder: string): string {
  return holder.slice(0, holder.indexOf("."));
}

/** inboxPrefix is where a principal's replies come: _INBOX.<principal>. */
export function inboxPrefix(holder: string): string {
  return `_INBOX.${principalOf(holder)}`;
}

const encoder = new TextEncoder();

/**
 * partitionOf is the default partition of a task: fnv1a32 over the task id's
 * UTF-8 bytes, mod the partition count. A task already committed is pinned to
 * the partition task.head reports, whatever this says.
 */
export function partitionOf(task: string, partitions: number): number {
  if (!Number.isInteger(partitions) || partitions < 1) {
    throw new RangeError(`partitions must be a positive integer, got ${partitions}`);
  }
  let h = 0x811c9dc5;
  for (const b of encoder.encode(task)) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h % partitions;
}

/** Verdict is an event's final outcome (contract §3). */
export type Verdict = "committed" | "duplicate" | "stale" | "conflict" | "gap" | "invalid";

/** Receipt is the ledger's verdict on one event (contract §3, Receipts). */
export interface Receipt {
  event_id: string;
  task: string;
  partition: number;
  version: number;
  verdict: Verdict;
  reason: string;
  seq: number;
  generation: number;
  /** The partition's generation as the ledger saw it: 0 when never leased, and for invalid receipts. */
  current_generation: number;
  /** The partition's effective fence mode (contract §13); absent on invalid receipts. */
  fence_mode?: "enforce" | "observe";
  /** On a commit under observe: what enforce would have answered, "stale/<reason>". */
  would_reject?: string;
}

/** TaskHead is a task's head: partition and type are null for a task never committed. */
export interface TaskHead {
  task: string;
  partition: number | null;
  version: number;
  seq?: number;
  type: string | null;
  /** The principal that wrote version 1, which alone may write the task; null when none is known. */
  owner?: string | null;
  /** The task's kind, "events" or "snapshot" (contract §14), pinned by its first committed event; null for a task never committed. */
  kind?: "events" | "snapshot" | null;
}

/** EventVerdict is what the verdict lookup answers for an event id. */
export interface EventVerdict {
  event_id: string;
  verdict: Verdict;
  reason: string;
  seq: number;
}

/** LeaseReply is the lease service's success reply to acquire, renew and get. */
export interface LeaseReply {
  partition: number;
  holder: string;
  generation: number;
  expires_at: string;
  ttl_ms: number;
  valid?: boolean;
  partitions?: number;
}

/** ErrorReply is the lease service's error body. */
export interface ErrorReply {
  error: string;
  message: string;
  holder?: string;
  generation?: number;
  expires_at?: string;
  partitions?: number;
  /** On a lost reply: the operator's revoke that fenced the requester's generation (contract §12). */
  revoked?: OperatorAction;
  /** On a held reply: the cordon that refuses every grant of the partition (contract §12). */
  cordoned?: OperatorAction;
}

/** OperatorAction is an operator's revoke or cordon: who, why, when (RFC 3339, the database's clock). */
export interface OperatorAction {
  by: string;
  reason: string;
  at: string;
}

/** Projection is a task's value in the bucket ledger_tasks (contract §6). */
export interface Projection {
  task: string;
  partition: number;
  version: number;
  status: string;
  data: unknown;
  seq: number;
  updated_at: string;
  gap?: unknown;
  data_too_large?: number;
  /** "snapshot" for a snapshot task (contract §14), whose data is its newest snapshot; absent for an events task. */
  kind?: "snapshot";
}

/** Subjects names the contract's subjects under a prefix. */
export class Subjects {
  constructor(readonly prefix: string = PREFIX_DEFAULT) {}
  lease(op: "acquire" | "renew" | "release", holder: string): string {
    return `${this.prefix}.lease.${op}.${holder}`;
  }
  leaseGet(): string {
    return `${this.prefix}.lease.get`;
  }
  taskHead(): string {
    return `${this.prefix}.task.head`;
  }
  inbound(holder: string, partition: number, task: string): string {
    return `${this.prefix}.in.${holder}.${partition}.${task}`;
  }
  /** inboundBatch is where a holder publishes a batch of a partition's events. */
  inboundBatch(holder: string, partition: number): string {
    return `${this.prefix}.in.${holder}.${partition}`;
  }
  receipt(holder: string): string {
    return `${this.prefix}.receipt.${holder}`;
  }
}

/** BatchEvent is one event of a batch message's body. */
export interface BatchEvent {
  id: string;
  task: string;
  version: number;
  type: string;
  /** A JSON value's UTF-8 bytes; empty is null. */
  payload: Uint8Array;
  snapshot: boolean;
}

/**
 * batchBody is a batch message's body (contract §2, "Batches"), byte for byte
 * as the Go pkg/wire writes it: a JSON array of event objects. Ids, tasks and
 * types are checked to need no escaping, so they are written as they are.
 */
export function batchBody(events: readonly BatchEvent[]): Uint8Array {
  if (events.length === 0) return new Uint8Array([0x5b, 0x5d]); // []
  // Each piece is what comes before an event's payload: the end of the
  // previous object and this one's head. Everything but the payloads is
  // ASCII, so a piece is one latin1 write, in place, and a payload one copy.
  const pieces: string[] = new Array(events.length);
  let size = 0;
  let end = "[";
  for (let i = 0; i < events.length; i++) {
    const e = events[i]!;
    const payload = e.payload.length > 0 ? "" : "null";
    pieces[i] = `${end}{"event_id":"${e.id}","task":"${e.task}","version":${e.version},"type":"${e.type}","payload":${payload}`;
    size += pieces[i]!.length + e.payload.length;
    end = e.snapshot ? `,"kind":"snapshot"},` : "},";
  }
  const last = `${end.slice(0, -1)}]`;
  // The buffer is its own (not the pool's), and every byte of it is written.
  const body = Buffer.allocUnsafeSlow(size + last.length);
  let n = 0;
  for (let i = 0; i < events.length; i++) {
    const e = events[i]!;
    n += body.write(pieces[i]!, n, "latin1");
    body.set(e.payload, n);
    n += e.payload.length;
  }
  n += body.write(last, n, "latin1");
  return new Uint8Array(body.buffer, body.byteOffset, n);
}

/** BatchMessage is a batch's body and the values of its headers. */
export interface BatchMessage {
  body: Uint8Array;
  /** Nats-Msg-Id: batch-<first event id>:<token>. */
  msgId: string;
  /** Ledger-Generation. */
  generation: string;
  /** Ledger-Batch: the number of events. */
  count: string;
}

/**
 * batchMessage is events of one holder, partition and generation as one
 * LEDGER_IN message on subject. The Nats-Msg-Id token is the content token
 * of the subject, the generation, the count, an empty type and the body,
 * so LEDGER_IN drops only an identical re-send.
 */
export function batchMessage(subject: string, generation: number, events: readonly BatchEvent[]): BatchMessage {
  if (events.length === 0 || events.length > MAX_BATCH) throw new RangeError(`a batch has 1..${MAX_BATCH} events, not ${events.length}`);
  const body = batchBody(events);
  const gen = String(generation);
  const count = String(events.length);
  return { body, msgId: `batch-${events[0]!.id}:${contentToken(subject, gen, count, "", body)}`, generation: gen, count };
}
