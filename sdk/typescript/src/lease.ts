import { headers as natsHeaders } from "@nats-io/transport-node";
import type { MsgHdrs } from "@nats-io/transport-node";

import type { CallOptions, Client } from "./client.js";
import { raceAbort, sleep } from "./client.js";
import { LedgerError, RejectedError } from "./errors.js";
import { contentToken, ulid } from "./ulid.js";
import { validTask, validType, type LeaseReply, type Receipt, type TaskHead } from "./wire.js";

/**
 * safetyMarginMs is how much earlier than TTL after a request was sent the
 * client stops trusting the lease it confirmed: 2% of the TTL for clock-rate
 * drift between this host and the database, plus 25 ms for a late timer.
 */
export function safetyMarginMs(ttlMs: number): number {
  return ttlMs / 50 + 25;
}

/** AcquireAttempt is one acquire request across its sends: its id and when it was first sent. */
export interface AcquireAttempt {
  id: string;
  firstMono: number;
  firstWall: number;
}

const decoder = new TextDecoder();

/**
 * utf8 is a string payload's bytes. Buffer.from carves a small one from a
 * shared pool, where TextEncoder gives each its own ArrayBuffer: under half
 * the time, and less for the garbage collector.
 */
function utf8(s: string): Uint8Array {
  return Buffer.from(s, "utf8");
}

/** NO_PAYLOAD is the empty payload (null), shared: it has no byte to change. */
const NO_PAYLOAD = new Uint8Array(0);

/** BATCH_OVERHEAD is an element's JSON in a batch beyond its payload, task and type, with room to spare. */
const BATCH_OVERHEAD = 128;

/** SEND_CHUNK is how many queued events, of every lease together, leave before the event loop gets a turn. */
const SEND_CHUNK = 128;
let turnBudget = SEND_CHUNK;
let turnReset = false;

/** spendTurn takes one send from this turn of the event loop's budget; false when it is spent. */
function spendTurn(): boolean {
  if (!turnReset) {
    turnReset = true;
    setImmediate(() => {
      turnBudget = SEND_CHUNK;
      turnReset = false;
    });
  }
  return turnBudget-- > 0;
}

/** acquireLease is Client.acquire with a request that may have been sent before. */
export async function acquireLease(c: Client, partition: number, attempt: AcquireAttempt, signal?: AbortSignal): Promise<Lease> {
  if (!Number.isInteger(partition) || partition < 0) {
    throw new LedgerError("INVALID", `ledger: acquire partition ${partition}: not a partition`);
  }
  if (c.closed) throw new LedgerError("CLOSED", "ledger: client closed");
  if (c.leases.has(partition)) throw new LedgerError("LEASE_ACTIVE", `ledger: acquire partition ${partition}: this client already holds it`);
  c.leases.set(partition, null); // reserved while the request is in flight
  let l: Lease | undefined;
  try {
    // The local deadline counts from the first send: the grant may have been
    // made while serving it and its reply lost, so a later send may follow it.
    if (attempt.firstMono === 0) {
      attempt.firstMono = performance.now();
      attempt.firstWall = Date.now();
    }
    const reply = await sendAcquire(c, partition, attempt, signal);
    l = new Lease(c, reply, attempt);
    if (c.closed) {
      l.end(new LedgerError("CLOSED", "ledger: client closed"), false);
      throw new LedgerError("CLOSED", "ledger: client closed");
    }
    if (l.deadlineMono - performance.now() < (l.ttlMs * 2) / 3) await l.confirmLateGrant(signal);
    c.leases.set(partition, l);
    l.start();
    c.log.info("lease acquired", { partition, generation: l.generation, holder: c.holder, expires_at: reply.expires_at });
    return l;
  } catch (err) {
    if (c.leases.get(partition) === null || c.leases.get(partition) === l) c.leases.delete(partition);
    throw err;
  }
}

/** sendAcquire sends an acquire until it is answered: again, with the same request_id, after a timeout. */
async function sendAcquire(c: Client, partition: number, attempt: AcquireAttempt, signal?: AbortSignal): Promise<LeaseReply> {
  const subject = c.subjects.lease("acquire", c.holder);
  const body = { partition, ttl_ms: c.cfg.ttlMs, request_id: attempt.id };
  let backoff = 20;
  for (let n = 1; ; n++) {
    const sent = performance.now();
    try {
      return (await c.request(subject, body, signal)) as LeaseReply;
    } catch (err) {
      signal?.throwIfAborted();
      if (!(err instanceof LedgerError && err.code === "UNAVAILABLE")) throw err;
      if (!signal && n >= 3) throw err;
      c.log.debug("acquire not answered; sending it again with its request_id", { partition, request_id: attempt.id, attempt: n });
      await sleep(backoff - (performance.now() - sent), signal);
      backoff = Math.min(2 * backoff, 500);
    }
  }
}

type LeaseState = "active" | "releasing" | "ended";

/** TaskState is what a lease knows of one task. */
interface TaskState {
  known: boolean;
  next: number;
  looking: boolean;
  pinned?: LedgerError;
  queue: Pending[];
  resync?: Promise<void>;
  inflight: number;
  refused?: Receipt;
}

/** PublishOptions bound one publish. */
export interface PublishOptions {
  /** A signal that ends before the event's version is assigned sends nothing (NOT_SENT). */
  signal?: AbortSignal;
}

/**
 * Lease is a partition's lease: the right to publish events on the partition
 * under its generation. It renews itself every renewEveryMs until release(),
 * Client.close() or its loss, and trusts itself only until its local
 * deadline: TTL after the last confirmed request was SENT, on the monotonic
 * clock, less a margin. Its signal aborts at the loss, with a LedgerError
 * LEASE_LOST (or RELEASED, CLOSED) as the reason.
 */
export class Lease {
  readonly partition: number;
  readonly generation: number;
  readonly ttlMs: number;
  /** The local deadline on performance.now()'s clock, and on the wall clock. */
  deadlineMono: number;
  deadlineWall: number;
  /** expiresAt is the expiry the database reported last, by its own clock: for display, never compared with the local clock. */
  expiresAt: Date;
  readonly #ctl = new AbortController();
  #state: LeaseState = "active";
  #deadlineTimer?: NodeJS.Timeout;
  #renewTimer?: NodeJS.Timeout;
  /** Renewals in flight, and the send time of the newest that succeeded. */
  readonly #renewals = new Set<Promise<void>>();
  #lastRenewSent = 0;
  #renewalsOff = false;
  #lostResolve!: (e: LedgerError) => void;
  /** lost resolves with the reason when the lease is lost (not on release or close). */
  readonly lost: Promise<LedgerError> = new Promise((r) => (this.#lostResolve = r));
  readonly #tasks = new Map<string, TaskState>();
  #inflight = 0;
  #slotWaiters: (() => void)[] = [];
  /** Slots handed to woken publishes that have not counted themselves yet. */
  #reserved = 0;
  #woken: (() => void)[] = [];
  #wakeScheduled = false;
  #idleWaiters: (() => void)[] = [];
  // The batch gathering (docs/contract.md §2, "Batches"); gen counts the
  // batches begun, so a linger timer flushes only its own.
  #batch: Pending[] = [];
  #batchBytes = 0;
  #batchGen = 0;

  constructor(
    readonly client: Client,
    reply: LeaseReply,
    attempt: AcquireAttempt,
  ) {
    this.partition = reply.partition;
    this.generation = reply.generation;
    this.ttlMs = reply.ttl_ms > 0 ? reply.ttl_ms : client.cfg.ttlMs;
    const margin = safetyMarginMs(this.ttlMs);
    this.deadlineMono = attempt.firstMono + this.ttlMs - margin;
    this.deadlineWall = attempt.firstWall + this.ttlMs - margin;
    this.expiresAt = new Date(reply.expires_at);
  }

  /** signal aborts when the lease ends; its reason says why (code LEASE_LOST, RELEASED or CLOSED). */
  get signal(): AbortSignal {
    return this.#ctl.signal;
  }

  /** start arms the deadline timer and the keep-alive. */
  start(): void {
    this.#armDeadline();
    this.#scheduleRenew(performance.now() + this.client.cfg.renewEveryMs);
  }

  /** confirmLateGrant renews a grant that came so late that less than two thirds of its TTL is left. */
  async confirmLateGrant(signal?: AbortSignal): Promise<void> {
    try {
      await this.#renewOnce(signal, this.client.cfg.requestTimeoutMs);
    } catch (err) {
      const refused = err instanceof LedgerError && (err.code === "LOST" || err.code === "NO_LEASE");
      if (refused || !this.#before()) {
        const e = new LedgerError("LEASE_LOST", `ledger: lease lost: generation ${this.generation} was granted too late to keep: ${(err as Error).message}`, {
          cause: err,
        });
        this.end(e, false);
        throw e;
      }
      this.client.log.warn("late lease grant not confirmed yet; the keep-alive goes on trying", { partition: this.partition });
    }
  }

  #before(): boolean {
    return performance.now() < this.deadlineMono && Date.now() < this.deadlineWall;
  }

  #armDeadline(): void {
    clearTimeout(this.#deadlineTimer);
    this.#deadlineTimer = setTimeout(() => this.#onDeadline(), Math.max(0, this.deadlineMono - performance.now()));
  }

  #onDeadline(): void {
    if (this.#state === "ended") return;
    if (this.#before()) return this.#armDeadline(); // extended meanwhile
    this.end(this.#deadlineError(), true);
  }

  #deadlineError(): LedgerError {
    return new LedgerError(
      "LEASE_LOST",
      `ledger: lease lost: partition ${this.partition} generation ${this.generation}: no renewal confirmed before the local deadline ` +
        `(TTL ${this.ttlMs} ms after the last confirmed request was sent, less a safety margin)`,
    );
  }

  #scheduleRenew(atMono: number): void {
    clearTimeout(this.#renewTimer);
    this.#renewTimer = setTimeout(() => this.#renew(), Math.max(0, atMono - performance.now()));
  }

  /** stopped says whether the keep-alive should stop: read afresh after every await. */
  #stopped(): boolean {
    return this.#state === "ended" || this.#renewalsOff;
  }

  /**
   * renew sends one renewal, bounded by the local deadline rather than by a
   * short attempt: on a busy event loop its reply can be read late, and a
   * late reply still proves the lease. One left unanswered for half the
   * renewal interval is followed by another (a reply can be lost), while the
   * first may still answer. Each success schedules the next renewal from its
   * own send time.
   */
  #renew(): void {
    if (this.#stopped()) return;
    const every = this.client.cfg.renewEveryMs;
    let settled = false;
    const again = setTimeout(() => !settled && this.#renew(), Math.max(every / 2, 50));
    const sent = performance.now();
    const done = this.#renewOnce(this.#ctl.signal, this.deadlineMono - sent).then(
      () => {
        if (this.#stopped() || sent < this.#lastRenewSent) return;
        this.#lastRenewSent = sent;
        this.#scheduleRenew(sent + every);
      },
      (err) => {
        if (this.#stopped()) return;
        if (err instanceof LedgerError && (err.code === "LOST" || err.code === "NO_LEASE")) {
          this.end(
            new LedgerError("LEASE_LOST", `ledger: lease lost: partition ${this.partition} generation ${this.generation}: renewal refused: ${err.message}`, {
              cause: err,
            }),
            true,
          );
          return;
        }
        this.client.log.warn("lease renewal failed; retrying until the local deadline", {
          partition: this.partition,
          generation: this.generation,
          left_ms: Math.round(this.deadlineMono - performance.now()),
          error: String(err),
        });
        if (this.#renewals.size === 1) this.#scheduleRenew(performance.now() + Math.max(every / 4, 10));
      },
    );
    const tracked: Promise<void> = done.finally(() => {
      settled = true;
      clearTimeout(again);
      this.#renewals.delete(tracked);
    });
    this.#renewals.add(tracked);
  }

  /** renewOnce sends one renewal and moves the local deadline to TTL after its send, less the margin. It returns the send time. */
  async #renewOnce(signal: AbortSignal | undefined, timeoutMs: number): Promise<number> {
    if (timeoutMs <= 0) throw new LedgerError("UNAVAILABLE", "ledger: no time left before the local deadline");
    const sentMono = performance.now();
    const sentWall = Date.now();
    const reply = (await this.client.request(
      this.client.subjects.lease("renew", this.client.holder),
      { partition: this.partition, generation: this.generation, ttl_ms: this.ttlMs },
      signal,
      timeoutMs,
    )) as LeaseReply;
    const ttl = reply.ttl_ms > 0 ? reply.ttl_ms : this.ttlMs;
    const margin = safetyMarginMs(ttl);
    if (this.#state !== "ended" && sentMono + ttl - margin > this.deadlineMono) {
      this.deadlineMono = sentMono + ttl - margin;
      this.deadlineWall = sentWall + ttl - margin;
      if (this.#deadlineTimer) this.#armDeadline();
    }
    this.expiresAt = new Date(reply.expires_at);
    return sentMono;
  }

  /** end ends the lease once with reason: stops the timers and aborts its signal. Events already sent keep waiting for receipts. */
  end(reason: LedgerError, lost: boolean): void {
    if (this.#state === "ended") return;
    this.#state = "ended";
    clearTimeout(this.#deadlineTimer);
    clearTimeout(this.#renewTimer);
    // Forget the lease before anyone hears of its end: a standby woken by the
    // signal calls acquireWait at once and must not meet LEASE_ACTIVE.
    if (this.client.leases.get(this.partition) === this) this.client.leases.delete(this.partition);
    this.#ctl.abort(reason);
    for (const w of this.#slotWaiters.splice(0)) {
      this.#reserved++; // each woken publish gives its reservation back, then finds the lease ended
      w();
    }
    for (const w of this.#idleWaiters.splice(0)) w();
    if (lost) {
      this.#lostResolve(reason);
      this.client.log.warn("lease lost", { partition: this.partition, generation: this.generation, cause: reason.message });
    }
  }

  /** usable throws unless events may be published: active, and the local deadline not passed (checked here, not only by the timer). */
  #usable(allowReleasing = false): void {
    if (this.#state === "ended") throw this.#ctl.signal.reason;
    if (!this.#before()) {
      this.end(this.#deadlineError(), true);
      throw this.#ctl.signal.reason;
    }
    if (this.#state === "releasing" && !allowReleasing) {
      throw new LedgerError("RELEASED", `ledger: partition ${this.partition}: lease released`);
    }
  }

  #task(task: string): TaskState {
    let ts = this.#tasks.get(task);
    if (!ts) {
      ts = { known: false, next: 0, looking: false, queue: [], inflight: 0 };
      this.#tasks.set(task, ts);
    }
    return ts;
  }

  /**
   * publish sends one event of task under the lease and resolves with its
   * Pending at once: the verdict comes later (pending.wait()). Versions are the
   * task's head + 1, + 2, ... in call order: the first event of a task waits
   * for a head lookup (asked together with other tasks'), later ones are
   * numbered locally. At most maxInFlight events of the lease wait for their
   * receipts; publish waits for a slot while they do. It rejects with
   * LEASE_LOST once the lease is lost (by the local deadline too), RELEASED,
   * RESYNC_NEEDED after a refused event of the task, WRONG_PARTITION, INVALID,
   * and NOT_SENT when opts.signal ends first.
   */
  publish(task: string, type: string, payload?: Uint8Array | string, opts?: PublishOptions): Promise<Pending> {
    // Not async itself: an async wrapper costs each event a promise and two microtask turns.
    return this.#publishKind(task, type, payload, opts, false);
  }

  /**
   * publishSnapshot is publish for a snapshot task (contract §14): payload is
   * the task's complete state, and the event carries Ledger-Kind: snapshot.
   * Its version is assigned as publish assigns it, but the ledger commits it
   * without waiting for versions it skips, and the projection is the newest
   * snapshot committed. A task's first committed event chooses its kind for
   * ever: a snapshot of an events task, or a publish() to a snapshot task, is
   * refused invalid/wrong_kind.
   */
  publishSnapshot(task: string, type: string, payload?: Uint8Array | string, opts?: PublishOptions): Promise<Pending> {
    return this.#publishKind(task, type, payload, opts, true);
  }

  /**
   * publishKind is publish and publishSnapshot. An event that need not wait (a
   * slot is free and its task has no resync under way) is checked, counted and
   * sent here, at once. Only one that waits goes through an async function,
   * whose frame and promise cost each event hundreds of bytes of garbage.
   */
  #publishKind(
    task: string,
    type: string,
    payload: Uint8Array | string | undefined,
    opts: PublishOptions | undefined,
    snapshot: boolean,
    isJSON = false,
  ): Promise<Pending> {
    const signal = opts?.signal;
    let data: Uint8Array;
    try {
      data = this.#payloadOf(task, type, payload, isJSON);
      this.#usable();
      if (signal?.aborted) throw notSent(task, signal.reason);
      if (this.#inflight + this.#reserved < this.client.cfg.maxInFlight && this.#slotWaiters.length === 0) {
        const ts = this.#task(task);
        if (!ts.resync && !ts.pinned) return Promise.resolve(this.#enter(ts, task, type, data, signal, snapshot));
      }
    } catch (err) {
      return Promise.reject(err);
    }
    return this.#publishWaiting(task, type, data, signal, snapshot);
  }

  /** payloadOf checks an event's task, type and payload, and returns the payload's bytes. */
  #payloadOf(task: string, type: string, payload: Uint8Array | string | undefined, isJSON: boolean): Uint8Array {
    const data = typeof payload === "string" ? utf8(payload) : (payload ?? NO_PAYLOAD);
    if (!validTask(task)) throw new LedgerError("INVALID", `ledger: publish: task id ${JSON.stringify(task)} is not 1..128 of [A-Za-z0-9_-]`);
    if (!validType(type)) throw new LedgerError("INVALID", `ledger: publish: event type ${JSON.stringify(type)} is not 1..64 of [A-Za-z0-9_.:-]`);
    if (data.length > this.client.cfg.maxPayload) {
      throw new LedgerError("INVALID", `ledger: publish: payload of ${data.length} bytes is above ${this.client.cfg.maxPayload}`);
    }
    // A batch carries payloads inside its JSON body, so one that is not JSON
    // would spoil its neighbours' events: every payload is checked.
    if (data.length > 0 && !isJSON) {
      try {
        JSON.parse(typeof payload === "string" ? payload : decoder.decode(data));
      } catch {
        throw new LedgerError("INVALID", "ledger: publish: payload is not JSON");
      }
    }
    return data;
  }

  /** publishWaiting is publishKind for an event that waits for a slot, or for its task's resync. */
  async #publishWaiting(task: string, type: string, data: Uint8Array, signal: AbortSignal | undefined, snapshot: boolean): Promise<Pending> {
    if (this.#inflight + this.#reserved >= this.client.cfg.maxInFlight || this.#slotWaiters.length > 0) {
      await this.#slot(signal, task);
    }
    const ts = this.#task(task);
    while (ts.resync) {
      await (signal ? raceAbort(ts.resync, signal).catch((e) => this.#undoSlot(notSent(task, e))) : ts.resync);
    }
    if (ts.pinned) this.#undoSlot(ts.pinned);
    return this.#enter(ts, task, type, data, signal, snapshot);
  }

  /** enter counts a new event of ts in flight and sends it, or queues it behind its task's head lookup. */
  #enter(ts: TaskState, task: string, type: string, data: Uint8Array, signal: AbortSignal | undefined, snapshot: boolean): Pending {
    const p = new Pending(this, task, type, data, snapshot);
    this.#inflight++;
    ts.inflight++;
    if (ts.known) {
      try {
        this.#send(ts, p, signal, false);
      } catch (err) {
        this.#uncount(ts);
        throw err;
      }
      return p;
    }
    if (ts.refused) {
      this.#uncount(ts);
      throw this.#resyncError(task, ts.refused);
    }
    p.signal = signal;
    ts.queue.push(p);
    if (!ts.looking) {
      ts.looking = true;
      void this.#fillHead(task, ts);
    }
    return p;
  }

  /** publishJSON is publish with JSON.stringify(value) as the payload. */
  publishJSON(task: string, type: string, value: unknown, opts?: PublishOptions): Promise<Pending> {
    return this.#publishJSON(task, type, value, opts);
  }

  #publishJSON(task: string, type: string, value: unknown, opts: PublishOptions | undefined): Promise<Pending> {
    let s: string | undefined;
    try {
      s = JSON.stringify(value);
    } catch (err) {
      return Promise.reject(new LedgerError("INVALID", `ledger: publish to task ${task} not sent: payload cannot be encoded as JSON`, { cause: err }));
    }
    if (s === undefined) return Promise.reject(new LedgerError("INVALID", `ledger: publish to task ${task} not sent: value has no JSON form`));
    return this.#publishKind(task, type, utf8(s), opts, false, true);
  }

  async #slot(signal: AbortSignal | undefined, task: string): Promise<void> {
    let resolve!: () => void;
    const wait = new Promise<void>((r) => (resolve = r));
    this.#slotWaiters.push(resolve);
    try {
      await (signal ? raceAbort(wait, signal) : wait);
    } catch (err) {
      const i = this.#slotWaiters.indexOf(resolve);
      if (i >= 0) this.#slotWaiters.splice(i, 1);
      else {
        this.#reserved--; // woken meanwhile: pass the slot on
        this.#undoSlot(notSent(task, err));
      }
      throw notSent(task, err);
    }
    this.#reserved--;
    try {
      this.#usable();
    } catch (err) {
      this.#undoSlot(err);
    }
  }

  /** undoSlot throws err for a publish that holds a slot it did not count yet, passing the slot on. */
  #undoSlot(err: unknown): never {
    this.#wake();
    throw err;
  }

  /** wake hands free slots to waiting publishes, in call order, reserving each until it counts itself. */
  #wake(): void {
    while (this.#inflight + this.#reserved < this.client.cfg.maxInFlight && this.#slotWaiters.length > 0) {
      this.#reserved++;
      this.#woken.push(this.#slotWaiters.shift()!);
    }
    // The woken publishes run after pending I/O, not inside the receipt
    // handler that freed their slots: a burst of receipts then does not hold
    // the event loop (and a renewal's reply) for the publishes it lets go.
    if (this.#woken.length > 0 && !this.#wakeScheduled) {
      this.#wakeScheduled = true;
      setImmediate(() => {
        this.#wakeScheduled = false;
        for (const w of this.#woken.splice(0)) w();
      });
    }
  }

  #resyncError(task: string, r: Receipt): LedgerError {
    return new LedgerError(
      "RESYNC_NEEDED",
      `ledger: publish to task ${task}: event ${r.event_id} (version ${r.version}) was refused ${r.verdict}/${r.reason}: resync the task`,
    );
  }

  /** send gives p the task's next version and publishes it. counted: p is in the in-flight count already. */
  #send(ts: TaskState, p: Pending, signal: AbortSignal | undefined, queued: boolean): void {
    this.#usable(queued);
    if (ts.refused) throw this.#resyncError(p.task, ts.refused);
    if (signal?.aborted) throw notSent(p.task, signal.reason);
    p.assign(ts.next++);
    p.sent = true;
    if (!this.client.batching) return this.client.send(p);
    this.client.register(p);
    this.#add(p);
  }

  /**
   * add puts p into the lease's batch and sends the batch when it is full;
   * the first event of a batch starts its linger. The events published
   * within batchLingerMs of each other leave in one message, each kept to its
   * own verdict: its Pending, receipt, lookup and re-sends are its own.
   */
  #add(p: Pending): void {
    const cfg = this.client.cfg;
    const size = p.payload.length + p.task.length + p.type.length + BATCH_OVERHEAD;
    if (this.#batch.length > 0 && this.#batchBytes + size > cfg.batchMaxBytes) this.#flush();
    this.#batch.push(p);
    this.#batchBytes += size;
    if (this.#batch.length >= cfg.batchMax || this.#batchBytes >= cfg.batchMaxBytes) this.#flush();
    else if (this.#batch.length === 1) {
      const gen = this.#batchGen;
      setTimeout(() => gen === this.#batchGen && this.#flush(), cfg.batchLingerMs);
    }
  }

  /**
   * flush sends the batch gathered so far, in order. One event goes as a batch of
   * one too: the ingest reads a partition's batches and single messages
   * with a consumer each, so a task whose versions went in both forms would
   * have a later one wait for an earlier one the other consumer holds. Only
   * an event larger than batchMaxBytes goes alone.
   */
  #flush(): void {
    const ps = this.#batch;
    const bytes = this.#batchBytes;
    this.#batch = [];
    this.#batchBytes = 0;
    this.#batchGen++;
    const c = this.client;
    if (c.closed || ps.length === 0) return; // close gave every event waiting for its ack CLOSED
    try {
      if (c.batching && (ps.length > 1 || bytes < c.cfg.batchMaxBytes)) return c.sendBatch(ps, c.subjects.inboundBatch(c.holder, this.partition), this.generation);
      for (const p of ps) c.sendAlone(p);
    } catch (err) {
      // The connection refused them: the sweep sends each again alone.
      c.log.debug("events not sent; sending them again", { partition: this.partition, error: String(err) });
      for (const p of ps) if (p.ackDue === Infinity) p.ackDue = performance.now();
    }
  }

  async #fillHead(task: string, ts: TaskState): Promise<void> {
    let head: TaskHead | undefined;
    let error: unknown;
    try {
      head = await this.client.headOf(task);
      if (head.partition !== null && head.partition !== this.partition) {
        error = ts.pinned = new LedgerError(
          "WRONG_PARTITION",
          `ledger: task ${task} is pinned to partition ${head.partition}, the lease is on ${this.partition}`,
        );
      }
    } catch (err) {
      error = this.#ctl.signal.aborted ? this.#ctl.signal.reason : err;
    }
    if (error) {
      ts.looking = false;
      for (const p of ts.queue.splice(0)) this.#drop(ts, p, error);
      return;
    }
    // The queued events leave in chunks, each after pending I/O: a lease that
    // queued a whole window behind its heads would otherwise hold the event
    // loop (and its renewals' replies) for as long as sending them takes.
    // Events published meanwhile queue behind them, as looking stays set.
    ts.next = head!.version + 1;
    // An index, not shift(): shifting a queue of a whole window is quadratic.
    let i = 0;
    while (i < ts.queue.length) {
      if (!spendTurn()) {
        ts.queue.splice(0, i);
        i = 0;
        await new Promise((r) => setImmediate(r));
        continue;
      }
      const p = ts.queue[i++]!;
      try {
        this.#send(ts, p, p.signal, true);
      } catch (err) {
        this.#drop(ts, p, err);
      }
    }
    ts.queue.length = 0;
    ts.looking = false;
    ts.known = true;
  }

  #drop(ts: TaskState, p: Pending, err: unknown): void {
    this.#uncount(ts);
    p.fail(err);
  }

  #uncount(ts: TaskState): void {
    ts.inflight--;
    this.#inflight--;
    this.#wake();
    if (this.#inflight === 0 || ts.inflight === 0) for (const w of this.#idleWaiters.splice(0)) w();
  }

  /** onReceipt frees the event's slot; stale ends the lease (its generation can never hold again); a refusal marks the task for a resync. */
  onReceipt(p: Pending, r: Receipt): void {
    const ts = this.#task(p.task);
    if ((r.verdict === "invalid" || r.verdict === "conflict" || r.verdict === "gap") && !ts.refused) ts.refused = r;
    this.#uncount(ts);
    if (r.verdict === "stale") {
      this.end(
        new LedgerError(
          "LEASE_LOST",
          `ledger: lease lost: partition ${this.partition} generation ${this.generation}: event ${r.event_id} came back stale (${r.reason}, current generation ${r.current_generation})`,
        ),
        true,
      );
    }
  }

  /** waitIdle waits until no event of the lease (or of ts) lacks its verdict. */
  async #waitIdle(signal: AbortSignal | undefined, ts?: TaskState): Promise<void> {
    for (;;) {
      const n = ts ? ts.inflight : this.#inflight;
      if (n === 0) return;
      if (this.#state === "ended") throw this.#ctl.signal.reason;
      const w = new Promise<void>((resolve) => this.#idleWaiters.push(resolve));
      try {
        await (signal ? raceAbort(w, signal) : w);
      } catch (err) {
        throw new LedgerError("NOT_SENT", `ledger: ${n} events still without a verdict: ${String(err)}`, { cause: err });
      }
    }
  }

  /**
   * resyncTask learns the task's head again after a refused event
   * (RESYNC_NEEDED), once every event of the task sent under the lease has its
   * verdict. It resolves with the head version; publishes of the task wait.
   */
  async resyncTask(task: string, opts: CallOptions = {}): Promise<number> {
    if (!validTask(task)) throw new LedgerError("INVALID", `ledger: resync: task id ${JSON.stringify(task)} is not 1..128 of [A-Za-z0-9_-]`);
    this.#usable();
    const ts = this.#task(task);
    while (ts.resync) await (opts.signal ? raceAbort(ts.resync, opts.signal) : ts.resync);
    let done!: () => void;
    ts.resync = new Promise<void>((r) => (done = r));
    try {
      await this.#waitIdle(opts.signal, ts);
      const head = await this.client.taskHead(task, opts);
      if (head.partition !== null && head.partition !== this.partition) {
        throw new LedgerError("WRONG_PARTITION", `ledger: task ${task} is pinned to partition ${head.partition}, the lease is on ${this.partition}`);
      }
      ts.known = true;
      ts.next = head.version + 1;
      ts.refused = undefined;
      return head.version;
    } finally {
      ts.resync = undefined;
      done();
    }
  }

  /**
   * release ends the lease cleanly: it refuses new events, waits until every
   * event has its verdict, stops the keep-alive, then releases the lease in
   * the ledger, so a standby takes over within a poll. It is final whatever it
   * resolves: if the signal ends first, no release is sent and the lease
   * expires by its TTL.
   */
  async release(opts: CallOptions = {}): Promise<void> {
    if (this.#state === "releasing") throw new LedgerError("RELEASED", `ledger: release partition ${this.partition}: already releasing`);
    if (this.#state === "ended") throw this.#ctl.signal.reason;
    this.#state = "releasing";
    try {
      await this.#waitIdle(opts.signal);
    } catch (err) {
      if (!this.#ctl.signal.aborted) {
        this.end(new LedgerError("RELEASED", "ledger: release abandoned with events in flight; the lease expires by its TTL"), false);
      }
      throw err;
    }
    // The keep-alive stops first: a renewal after the release would be refused and read as a loss.
    this.#renewalsOff = true;
    clearTimeout(this.#renewTimer);
    await Promise.all(this.#renewals);
    this.#usable(true);
    try {
      await this.client.request(
        this.client.subjects.lease("release", this.client.holder),
        { partition: this.partition, generation: this.generation },
        opts.signal,
      );
      this.end(new LedgerError("RELEASED", `ledger: partition ${this.partition}: lease released`), false);
    } catch (err) {
      if (err instanceof LedgerError && (err.code === "LOST" || err.code === "NO_LEASE")) {
        const e = new LedgerError("LEASE_LOST", `ledger: lease lost: partition ${this.partition} generation ${this.generation}: release refused: ${err.message}`, {
          cause: err,
        });
        this.end(e, true);
        throw e;
      }
      this.end(new LedgerError("RELEASED", `ledger: release not confirmed (${String(err)}); the lease expires by its TTL`), false);
      throw err;
    }
  }

  /** pauseRenewals stops the keep-alive as a paused process would: for tests of the local deadline. */
  pauseRenewalsForTest(): void {
    this.#renewalsOff = true;
    clearTimeout(this.#renewTimer);
  }
}

function notSent(task: string, cause: unknown): LedgerError {
  return new LedgerError("NOT_SENT", `ledger: publish to task ${task} not sent: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
}

/** PubAck is LEDGER_IN's acknowledgement: stored, not judged yet. Not a success signal. */
export interface PubAck {
  stream: string;
  seq: number;
  duplicate: boolean;
}

type Outcome<T> = { ok: true; value: T } | { ok: false; error: unknown };

/** NO_ACK is the ack outcome of an event whose receipt came first. */
const NO_ACK: Outcome<PubAck | undefined> = { ok: true, value: undefined };

/** receiptOf is an event's receipt, or throws why it has none. */
function receiptOf(o: Outcome<Receipt>): Receipt {
  if (!o.ok) throw o.error;
  return o.value;
}

/** committedOf is receiptOf for a commit (or duplicate): any other verdict throws a RejectedError. */
function committedOf(o: Outcome<Receipt>): Receipt {
  const r = receiptOf(o);
  if (r.verdict === "committed" || r.verdict === "duplicate") return r;
  throw new RejectedError(r);
}

/**
 * Pending is one published event on its way to its verdict. Its receipt (or,
 * when that was lost, the verdict looked up in the ledger) settles it once.
 */
export class Pending {
  /** The event id (a ULID): the ledger's idempotency key. */
  readonly id: string = ulid();
  /** The version, 0 until assigned (the first events of a task wait for its head). */
  version = 0;
  /** sent is set when the event has its version and leaves, alone or in a batch. */
  sent = false;
  signal?: AbortSignal;
  acked = false;
  // The deadlines start as Infinity, none due, so V8 sees doubles from the
  // first: a field that starts as a small integer and later holds a double
  // changes the hidden class, and every Pending alive then migrates to the new
  // one (a window queued behind its heads is thousands).
  ackDue = Infinity;
  ackFailed = false;
  /** The batch message the event left in, while its ack is awaited. */
  batch?: string;
  lookupDue = Infinity;
  lookingUp = false;
  /** unknown counts the lookups the ledger answered with no record of the event. */
  unknown = 0;
  /** resent is set once the client sent a copy of the event: a duplicate is then its commit. */
  resent = false;
  // A batched event needs its own subject, token and headers only if it goes
  // again alone: they are made when first asked for. Made for every event,
  // the SHA-256 and the headers took a sixth of the bench client's CPU.
  #subject?: string;
  #token?: string;
  #headers?: MsgHdrs;
  #done = false;
  #resolveDone!: (o: Outcome<Receipt>) => void;
  readonly #doneP = new Promise<Outcome<Receipt>>((r) => (this.#resolveDone = r));
  // The ack and the version are kept as values; a promise of either is made
  // only when asked for (most callers wait for the receipt alone).
  #ack?: Outcome<PubAck | undefined>;
  #ackWaiters?: ((o: Outcome<PubAck | undefined>) => void)[];
  #assigned = false;
  #versionWaiters?: ((v: number) => void)[];

  constructor(
    readonly lease: Lease,
    readonly task: string,
    readonly type: string,
    readonly payload: Uint8Array,
    /** snapshot marks an event of a snapshot task (publishSnapshot): header Ledger-Kind: snapshot. */
    readonly snapshot = false,
  ) {}

  /** done says whether the event has its verdict (or ended unsent). */
  get done(): boolean {
    return this.#done;
  }

  assign(version: number): void {
    this.version = version;
    this.#settleVersion();
  }

  #settleVersion(): void {
    if (this.#assigned) return;
    this.#assigned = true;
    if (this.#versionWaiters) for (const w of this.#versionWaiters.splice(0)) w(this.version);
  }

  /** subject is the event's own subject once sent, "" before. */
  get subject(): string {
    if (!this.sent) return "";
    const c = this.lease.client;
    return (this.#subject ??= c.subjects.inbound(c.holder, this.lease.partition, this.task));
  }

  /** token is the Nats-Msg-Id token of the event sent alone (contentToken), "" before it is sent. */
  get token(): string {
    if (!this.sent) return "";
    return (this.#token ??= contentToken(this.subject, String(this.lease.generation), String(this.version), this.type, this.payload));
  }

  /** headers are the headers of the event sent alone, undefined before it is sent. */
  get headers(): MsgHdrs | undefined {
    if (!this.sent) return undefined;
    return (this.#headers ??= this.#makeHeaders(this.token, String(this.lease.generation), String(this.version)));
  }

  #makeHeaders(token: string, gen: string, ver: string): MsgHdrs {
    const h = natsHeaders();
    h.set("Nats-Msg-Id", `${this.id}:${token}`);
    h.set("Ledger-Generation", gen);
    h.set("Ledger-Version", ver);
    h.set("Ledger-Type", this.type);
    if (this.snapshot) h.set("Ledger-Kind", "snapshot");
    return h;
  }

  /**
   * againHeaders are the headers of the n-th copy sent after the ledger had
   * no record of the event: the same, with the Nats-Msg-Id token suffixed
   * "-a<n>", so that LEDGER_IN stores it even where it remembers a lost copy.
   */
  againHeaders(n: number): MsgHdrs {
    return this.copyHeaders(`a${n}`);
  }

  /** copyHeaders are the event's headers with the Nats-Msg-Id token suffixed "-<suffix>". */
  copyHeaders(suffix: string): MsgHdrs {
    return this.#makeHeaders(`${this.token}-${suffix}`, String(this.lease.generation), String(this.version));
  }

  /** assigned resolves with the version once assigned, or 0 if the event ends unsent. */
  assigned(): Promise<number> {
    if (this.#assigned) return Promise.resolve(this.version);
    return new Promise((r) => (this.#versionWaiters ??= []).push(r));
  }

  setAck(ack: PubAck | undefined, error?: unknown): void {
    if (this.acked) return;
    this.setAckOutcome(error ? { ok: false, error } : ack ? { ok: true, value: ack } : NO_ACK);
  }

  /** setAckOutcome is setAck with an outcome that the events of one batch message share. */
  setAckOutcome(o: Outcome<PubAck | undefined>): void {
    if (this.acked) return;
    this.acked = true;
    this.#ack = o;
    if (this.#ackWaiters) for (const w of this.#ackWaiters.splice(0)) w(o);
  }

  resolve(r: Receipt): void {
    if (this.#done) return;
    this.#done = true;
    this.setAck(undefined);
    this.#resolveDone({ ok: true, value: r });
  }

  fail(err: unknown): void {
    if (this.#done) return;
    this.#done = true;
    this.#settleVersion(); // version stays 0: never sent
    this.setAck(undefined, err);
    this.#resolveDone({ ok: false, error: err });
  }

  /**
   * pubAck resolves when LEDGER_IN stored the event (not judged yet: not a
   * success signal); with undefined when the receipt came first.
   */
  async pubAck(): Promise<PubAck | undefined> {
    const o = this.#ack ?? (await new Promise<Outcome<PubAck | undefined>>((r) => (this.#ackWaiters ??= []).push(r)));
    if (!o.ok) throw o.error;
    return o.value;
  }

  // receipt and wait chain one then() on the outcome rather than awaiting in
  // async functions: a waiter an event, so each promise saved counts.

  /** receipt resolves with the event's verdict; it rejects if the event was never sent, or with CLOSED. */
  receipt(opts?: CallOptions): Promise<Receipt> {
    return (opts?.signal ? raceAbort(this.#doneP, opts.signal) : this.#doneP).then(receiptOf);
  }

  /** wait resolves with the receipt when committed (or duplicate), else rejects with a RejectedError. Wait with a signal of your own, not the lease's. */
  wait(opts?: CallOptions): Promise<Receipt> {
    return (opts?.signal ? raceAbort(this.#doneP, opts.signal) : this.#doneP).then(committedOf);
  }
}
