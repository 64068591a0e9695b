import { connect as natsConnect, headers as natsHeaders, NoRespondersError, TimeoutError, nuid } from "@nats-io/transport-node";
import type { Msg, MsgHdrs, NatsConnection, NodeConnectionOptions, Status, Subscription } from "@nats-io/transport-node";

import { LedgerError, ServiceError } from "./errors.js";
import { Lease, Pending, acquireLease, type AcquireAttempt } from "./lease.js";
import { ulid } from "./ulid.js";
import {
  HEADER_BATCH,
  MAX_BATCH,
  MAX_PAYLOAD_DEFAULT,
  PREFIX_DEFAULT,
  Subjects,
  TTL_MAX_MS,
  TTL_MIN_MS,
  batchMessage,
  inboxPrefix,
  partitionOf,
  validHolder,
  validTask,
  type ErrorReply,
  type EventVerdict,
  type LeaseReply,
  type Receipt,
  type TaskHead,
} from "./wire.js";
import { Reader } from "./reader.js";
import { natsOptions } from "./nats.js";

/** Logger receives the client's warnings and notes; default: warnings to console.warn. */
export interface Logger {
  warn(msg: string, attrs?: Record<string, unknown>): void;
  info(msg: string, attrs?: Record<string, unknown>): void;
  debug(msg: string, attrs?: Record<string, unknown>): void;
}

const textDecoder = new TextDecoder();

const defaultLogger: Logger = {
  warn: (msg, attrs) => console.warn(JSON.stringify({ level: "warn", msg, ...attrs })),
  info: () => {},
  debug: () => {},
};

/** Defaults of ConnectOptions, the Go SDK's. */
export const TTL_MS_DEFAULT = 3000;
export const REQUEST_TIMEOUT_MS_DEFAULT = 2000;
export const MAX_IN_FLIGHT_DEFAULT = 1024;
export const PUBLISH_ACK_TIMEOUT_MS_DEFAULT = 5000;
export const RECEIPT_TIMEOUT_MS_DEFAULT = 10_000;
export const BATCH_MAX_DEFAULT = 256;
export const BATCH_LINGER_MS_DEFAULT = 1;
export const BATCH_MAX_BYTES_DEFAULT = 512 << 10;
export const LOOKUP_BATCH_MAX_DEFAULT = 1000;

/** ConnectOptions configure a Client. Only holder is required. */
export interface ConnectOptions {
  /** <principal>.<instance>, each 1..64 of [A-Za-z0-9_-]. The principal is the NATS user; the instance names this process. */
  holder: string;
  /** NATS servers; default "127.0.0.1:4222". */
  servers?: string | string[];
  /**
   * More options of the NATS connections (credentials, TLS); their inboxPrefix is always _INBOX.<principal>.
   * maxReconnectAttempts defaults to -1, for ever: a client that gave up would strand its events (natsOptions).
   */
  nats?: Partial<NodeConnectionOptions>;
  /** Subject prefix; default "ledger". */
  prefix?: string;
  /** The deployment's partition count; default 0: asked of the lease service. */
  partitions?: number;
  /** Lease TTL asked for with every acquire and renewal: 100..300000 ms; default 3000. */
  ttlMs?: number;
  /** Interval between renewals; default ttlMs/3, at most ttlMs/2. */
  renewEveryMs?: number;
  /** Bounds one request to the lease service; default 2000 ms. */
  requestTimeoutMs?: number;
  /** How often acquireWait asks lease.get whether a held lease ended; default ttlMs/10. */
  standbyPollMs?: number;
  /** Events of one lease published and without a receipt; publish waits while reached. Default 1024. */
  maxInFlight?: number;
  /** Largest payload publish accepts; default 256 KiB. */
  maxPayload?: number;
  /** How long a publish waits for LEDGER_IN's ack before it is sent again under its id; default 5000 ms. */
  publishAckTimeoutMs?: number;
  /** How long after its ack an event waits for its receipt before the verdict is looked up, and how often again; default 10000 ms. */
  receiptTimeoutMs?: number;
  /** The most events of one lease in one LEDGER_IN message (contract §2, "Batches"), 1..1000; default 256. 1 sends every event alone, as does a ledger whose LEDGER_IN takes no batches. */
  batchMax?: number;
  /** How long the first event of a batch waits for more before the batch leaves; default 1 ms. Under load a batch fills before then. */
  batchLingerMs?: number;
  /** Bounds a batch message's body, which must stay within the server's max_payload; default 512 KiB. A larger event goes alone. */
  batchMaxBytes?: number;
  /** The most verdict lookups in one request, 1..1000; default 1000. Lookups that come due while one is in flight go together in the next, so a burst costs the principal's share of the lease service a few requests. 1 asks for each event alone, as does a client whose ledger does not know the batch form. */
  lookupBatchMax?: number;
  logger?: Logger;
}

/** Config is ConnectOptions with every default filled in. */
export type Config = Required<Omit<ConnectOptions, "servers" | "nats">>;

function withDefaults(o: ConnectOptions): Config {
  const ttlMs = o.ttlMs ?? TTL_MS_DEFAULT;
  return {
    holder: o.holder,
    prefix: o.prefix ?? PREFIX_DEFAULT,
    partitions: o.partitions ?? 0,
    ttlMs,
    renewEveryMs: o.renewEveryMs ?? Math.floor(ttlMs / 3),
    requestTimeoutMs: o.requestTimeoutMs ?? REQUEST_TIMEOUT_MS_DEFAULT,
    standbyPollMs: o.standbyPollMs ?? Math.floor(ttlMs / 10),
    maxInFlight: o.maxInFlight ?? MAX_IN_FLIGHT_DEFAULT,
    maxPayload: o.maxPayload ?? MAX_PAYLOAD_DEFAULT,
    publishAckTimeoutMs: o.publishAckTimeoutMs ?? PUBLISH_ACK_TIMEOUT_MS_DEFAULT,
    receiptTimeoutMs: o.receiptTimeoutMs ?? RECEIPT_TIMEOUT_MS_DEFAULT,
    batchMax: o.batchMax ?? BATCH_MAX_DEFAULT,
    batchLingerMs: o.batchLingerMs ?? BATCH_LINGER_MS_DEFAULT,
    batchMaxBytes: o.batchMaxBytes ?? BATCH_MAX_BYTES_DEFAULT,
    lookupBatchMax: o.lookupBatchMax ?? LOOKUP_BATCH_MAX_DEFAULT,
    logger: o.logger ?? defaultLogger,
  };
}

function validate(c: Config): void {
  const bad = (msg: string) => new LedgerError("INVALID", `ledger: ${msg}`);
  const pos = (n: number) => Number.isInteger(n) && n > 0;
  if (!validHolder(c.holder)) {
    throw bad(`holder ${JSON.stringify(c.holder)} must be <principal>.<instance>, each 1..64 of [A-Za-z0-9_-] (the principal is the NATS user)`);
  }
  if (!/^[A-Za-z0-9_-]{1,128}$/.test(c.prefix)) throw bad(`prefix ${JSON.stringify(c.prefix)} must be one subject token of [A-Za-z0-9_-]`);
  if (!Number.isInteger(c.partitions) || c.partitions < 0) throw bad(`partitions must be at least 1 (or 0: ask the service), got ${c.partitions}`);
  if (!Number.isInteger(c.ttlMs) || c.ttlMs < TTL_MIN_MS || c.ttlMs > TTL_MAX_MS) {
    throw bad(`ttlMs ${c.ttlMs} must be whole milliseconds in [${TTL_MIN_MS}, ${TTL_MAX_MS}]`);
  }
  if (!pos(c.renewEveryMs) || c.renewEveryMs > c.ttlMs / 2) throw bad(`renewEveryMs ${c.renewEveryMs} must be in (0, ttlMs/2 = ${c.ttlMs / 2}]`);
  for (const k of ["requestTimeoutMs", "standbyPollMs", "maxInFlight", "maxPayload", "publishAckTimeoutMs", "receiptTimeoutMs"] as const) {
    if (!pos(c[k])) throw bad(`${k} must be a positive integer, got ${c[k]}`);
  }
  if (!pos(c.batchMax) || c.batchMax > MAX_BATCH) throw bad(`batchMax must be 1..${MAX_BATCH}, got ${c.batchMax}`);
  if (!pos(c.lookupBatchMax) || c.lookupBatchMax > LOOKUP_BATCH_MAX_DEFAULT) {
    throw bad(`lookupBatchMax must be 1..${LOOKUP_BATCH_MAX_DEFAULT}, got ${c.lookupBatchMax}`);
  }
  if (!(c.batchLingerMs >= 0 && Number.isFinite(c.batchLingerMs)) || !pos(c.batchMaxBytes)) {
    throw bad(`batchLingerMs must not be negative and batchMaxBytes must be a positive integer`);
  }
}

/**
 * connect opens a NATS connection for holder (its replies come to
 * _INBOX.<principal>, the only inbox the principal may read), subscribes to
 * the holder's receipts before anything is sent, and, with partitions 0 (the
 * default), asks the lease service for the deployment's partition count.
 * Both connections reconnect for ever unless opts.nats.maxReconnectAttempts
 * says otherwise, so an event waits out any outage for its verdict.
 */
export async function connect(opts: ConnectOptions): Promise<Client> {
  const cfg = withDefaults(opts);
  validate(cfg);
  const options = { ...natsOptions(opts.servers, opts.nats), inboxPrefix: inboxPrefix(cfg.holder) };
  // Two connections: events, their acks and receipts on one; the lease
  // service on the other, so a renewal never queues behind a window of
  // events in a socket's buffers, in either direction.
  const nc = await natsConnect({ ...options, name: options.name ?? `${cfg.holder} events` });
  let ctl: NatsConnection | undefined;
  try {
    ctl = await natsConnect({ ...options, name: options.name ?? `${cfg.holder} leases` });
    const c = new Client(nc, cfg, ctl);
    await c.start();
    return c;
  } catch (err) {
    await nc.close();
    await ctl?.close();
    throw err;
  }
}

/** RequestOptions bound one call. */
export interface CallOptions {
  /** Ends the call early; it then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * Client is one worker's connection to the ledger: it acquires leases as its
 * holder and receives that holder's receipts. close() ends its leases (they
 * expire by their TTL) and closes the connection.
 */
export class Client {
  readonly subjects: Subjects;
  readonly log: Logger;
  /** The reader of projections on this connection (contract §9). */
  readonly reader: Reader;
  #partitions: number;
  #closed = false;
  #receipts?: Subscription;
  #acks?: Subscription;
  /** The reply subject prefix of publish acks: <inbox>.<nuid>.<event id>. */
  readonly ackPrefix: string;
  readonly leases = new Map<number, Lease | null>();
  /** Published events without a verdict, by event id. */
  readonly pending = new Map<string, Pending>();
  /** The events of each batch message waiting for its publish ack, by the ack subject's last token. */
  readonly batches = new Map<string, { ps: Pending[]; ackDue: number }>();
  /** noBatches is set once LEDGER_IN refused a batch: events go alone. */
  #noBatches = false;
  #sweeper?: NodeJS.Timeout;
  #heads: HeadBatcher;
  #lookups: LookupBatcher;
  /** reconnects counts the events' connection's reconnects to NATS: the copies' token suffix. */
  #reconnects = 0;
  #connected = true;
  /** The re-sends after each reconnect, one after another. */
  #resending: Promise<void> = Promise.resolve();

  constructor(
    readonly nc: NatsConnection,
    readonly cfg: Config,
    /** The connection of the lease service's requests; nc when not given. */
    readonly ctl: NatsConnection = nc,
  ) {
    this.subjects = new Subjects(cfg.prefix);
    this.log = cfg.logger;
    this.#partitions = cfg.partitions;
    this.ackPrefix = `${inboxPrefix(cfg.holder)}.${nuid.next()}`;
    this.reader = new Reader(nc);
    this.#heads = new HeadBatcher(this);
    this.#lookups = new LookupBatcher(this);
  }

  /** start subscribes to receipts and acks and learns the partition count. */
  async start(): Promise<void> {
    void this.#watchReconnects(this.nc.status());
    this.#receipts = this.nc.subscribe(this.subjects.receipt(this.cfg.holder), {
      callback: (err, m) => {
        if (!err) this.#onReceipt(m);
      },
    });
    this.#acks = this.nc.subscribe(`${this.ackPrefix}.*`, {
      callback: (err, m) => {
        if (!err) this.#onAck(m);
      },
    });
    await this.nc.flush();
    if (this.#partitions === 0) this.#partitions = await this.#askPartitions();
    const every = Math.max(10, Math.min(250, Math.floor(this.cfg.publishAckTimeoutMs / 4), Math.floor(this.cfg.receiptTimeoutMs / 4)));
    this.#sweeper = setInterval(() => this.#sweep(), every);
    this.#sweeper.unref();
  }

  /** holder is the client's holder id. */
  get holder(): string {
    return this.cfg.holder;
  }

  /** partitions is the partition count: ConnectOptions.partitions, or the deployment's. */
  get partitions(): number {
    return this.#partitions;
  }

  /** closed says whether close() was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** partitionOf is a task's default partition: fnv1a32(task) mod partitions. */
  partitionOf(task: string): number {
    return partitionOf(task, this.#partitions);
  }

  /**
   * taskHead asks the ledger for a task's head: its last version, the partition
   * it is pinned to and its last event's type. Read it after acquiring: before,
   * the old holder can still move it.
   */
  async taskHead(task: string, opts: CallOptions = {}): Promise<TaskHead> {
    if (!validTask(task)) throw new LedgerError("INVALID", `ledger: task id ${JSON.stringify(task)} is not 1..128 of [A-Za-z0-9_-]`);
    return (await this.request(this.subjects.taskHead(), { task }, opts.signal)) as TaskHead;
  }

  /** headOf is taskHead asked together with other lookups (one request per round trip). */
  headOf(task: string): Promise<TaskHead> {
    return this.#heads.lookup(task);
  }

  /**
   * acquire takes a partition's lease for the holder and keeps it alive. It
   * rejects with HELD (a ServiceError naming the holder) while another holder's
   * lease is valid, LEASE_ACTIVE when this client holds the partition, INVALID,
   * UNAVAILABLE when the service did not answer in time. The request carries a
   * request_id and is sent again with it while unanswered, so it is granted once.
   */
  acquire(partition: number, opts: CallOptions = {}): Promise<Lease> {
    return acquireLease(this, partition, { id: ulid(), firstMono: 0, firstWall: 0 }, opts.signal);
  }

  /**
   * acquireWait is acquire for a standby: it resolves with the lease as soon as
   * it can be had, waiting out another holder's lease (until its expiry plus
   * jitter, polling lease.get every standbyPollMs so a released lease is taken
   * at once), or rejects with the signal's reason.
   */
  async acquireWait(partition: number, opts: CallOptions = {}): Promise<Lease> {
    const signal = opts.signal;
    let attempt: AcquireAttempt = { id: ulid(), firstMono: 0, firstWall: 0 };
    let seen: string | undefined;
    for (;;) {
      try {
        return await acquireLease(this, partition, attempt, signal);
      } catch (err) {
        signal?.throwIfAborted();
        if (!(err instanceof LedgerError)) throw err;
        switch (err.code) {
          case "HELD": {
            attempt = { id: ulid(), firstMono: 0, firstWall: 0 };
            const se = err as ServiceError;
            const key = `${se.holder}/${se.generation}`;
            if (key !== seen) {
              this.log.info("partition held; standing by until the lease ends", { partition, holder: se.holder, generation: se.generation });
              seen = key;
            }
            await this.#standBy(partition, se.expiresAt, signal);
            break;
          }
          case "UNAVAILABLE":
            this.log.warn("lease service unavailable; standing by", { partition, error: err.message });
            await sleep(this.cfg.standbyPollMs, signal);
            break;
          case "LEASE_LOST":
            attempt = { id: ulid(), firstMono: 0, firstWall: 0 };
            break;
          default:
            throw err;
        }
      }
    }
  }

  async #standBy(partition: number, expiresAt: Date | undefined, signal?: AbortSignal): Promise<void> {
    for (;;) {
      let wait = this.cfg.standbyPollMs;
      let poll = true;
      if (expiresAt) {
        // Only a hint: the database's clock decides, and the poll backs it up.
        const until = expiresAt.getTime() - Date.now() + 5 + Math.random() * 25;
        if (until < wait) {
          wait = Math.max(until, 0);
          poll = false;
        }
      }
      await sleep(wait, signal);
      if (!poll) return;
      try {
        const r = (await this.request(this.subjects.leaseGet(), { partition }, signal)) as LeaseReply;
        if (!r.valid) return;
        expiresAt = new Date(r.expires_at);
      } catch (err) {
        signal?.throwIfAborted();
        if (err instanceof LedgerError && err.code === "NO_LEASE") return;
        this.log.debug("lease poll failed", { partition, error: String(err) });
      }
    }
  }

  /**
   * request sends one request to the lease service and returns the decoded
   * success reply. An error reply becomes a ServiceError; a service that does
   * not answer within requestTimeoutMs (or timeoutMs) is UNAVAILABLE.
   */
  async request(subject: string, body: unknown, signal?: AbortSignal, timeoutMs = this.cfg.requestTimeoutMs): Promise<unknown> {
    signal?.throwIfAborted();
    if (this.#closed) throw new LedgerError("CLOSED", "ledger: client closed");
    let m: Msg;
    const req = this.ctl.request(subject, JSON.stringify(body), { timeout: Math.max(1, Math.floor(timeoutMs)) });
    try {
      m = signal ? await raceAbort(req, signal) : await req;
    } catch (err) {
      signal?.throwIfAborted();
      if (err instanceof NoRespondersError || err instanceof TimeoutError || isTimeout(err)) {
        throw new LedgerError("UNAVAILABLE", `ledger: lease service unavailable: ${subject}: ${(err as Error).message}`, { cause: err });
      }
      throw err;
    }
    if (m.headers?.get("Nats-Service-Error-Code")) {
      let er: ErrorReply | undefined;
      try {
        er = m.json<ErrorReply>();
      } catch {
        // an error reply without a body of ours: described from its headers
      }
      if (!er || typeof er.error !== "string") {
        er = { error: "invalid", message: `error ${m.headers.get("Nats-Service-Error-Code")}: ${m.headers.get("Nats-Service-Error")}` };
      }
      throw new ServiceError(er);
    }
    return m.json();
  }

  async #askPartitions(): Promise<number> {
    let n: number | undefined;
    try {
      n = ((await this.request(this.subjects.leaseGet(), { partition: 0 })) as LeaseReply).partitions;
    } catch (err) {
      if (!(err instanceof ServiceError && err.code === "NO_LEASE")) {
        throw new LedgerError(
          "UNAVAILABLE",
          `ledger: ask the lease service for the partition count (set partitions to start without it): ${(err as Error).message}`,
          { cause: err },
        );
      }
      n = err.partitions;
    }
    if (!Number.isInteger(n) || n! < 1) throw new LedgerError("UNAVAILABLE", `ledger: the lease service told no partition count: ${n}`);
    return n!;
  }

  /** send publishes an event's message with its ack coming to the client's ack subject. */
  send(p: Pending): void {
    this.register(p);
    this.sendAlone(p);
  }

  /** register keeps p until its verdict; it waits for no ack until sent. */
  register(p: Pending): void {
    this.pending.set(p.id, p);
    p.ackDue = Infinity;
  }

  /** sendAlone publishes p's own message, as when batches are off. */
  sendAlone(p: Pending): void {
    p.batch = undefined;
    p.ackDue = performance.now() + this.cfg.publishAckTimeoutMs; // a publish that throws is sent again then
    this.nc.publish(p.subject, p.payload, { headers: p.headers, reply: `${this.ackPrefix}.${p.id}` });
  }

  /** batching says whether the client sends batches. */
  get batching(): boolean {
    return this.cfg.batchMax > 1 && !this.#noBatches;
  }

  /**
   * sendBatch publishes registered events of one lease as one batch message.
   * Each keeps its own ack deadline: one not acked in time goes again alone.
   */
  sendBatch(ps: Pending[], subject: string, generation: number): void {
    const m = batchMessage(subject, generation, ps);
    const h = natsHeaders();
    h.set("Nats-Msg-Id", m.msgId);
    h.set("Ledger-Generation", m.generation);
    h.set(HEADER_BATCH, m.count);
    const key = `${BATCH_MSG_ID_PREFIX}${ps[0]!.id}`;
    const due = performance.now() + this.cfg.publishAckTimeoutMs;
    this.batches.set(key, { ps, ackDue: due });
    for (const p of ps) {
      p.batch = key;
      p.ackDue = due;
    }
    try {
      this.nc.publish(subject, m.body, { headers: h, reply: `${this.ackPrefix}.${key}` });
    } catch (err) {
      this.#batchFailed(key, 0, String(err));
    }
  }

  #onReceipt(m: Msg): void {
    let rs: Receipt[];
    try {
      rs = m.headers?.get(HEADER_BATCH) ? m.json<Receipt[]>() : [m.json<Receipt>()];
      if (!Array.isArray(rs)) throw new Error("a batched receipt is not an array");
    } catch (err) {
      this.log.warn("undecodable receipt", { error: String(err) });
      return;
    }
    for (const r of rs) {
      if (!this.settle(r)) this.log.debug("receipt of no pending event", { event_id: r?.event_id, verdict: r?.verdict });
    }
  }

  /** settle gives an event its verdict once; whichever of receipt and lookup comes second changes nothing. */
  settle(r: Receipt): boolean {
    const p = this.pending.get(r.event_id);
    if (!p) return false;
    if (p.resent && r.verdict === "duplicate" && r.reason === "same_event_id") {
      // The answer to this client's own copy: the event is the row, as a lookup would report it.
      r = { ...r, verdict: "committed", reason: "" };
    }
    this.pending.delete(r.event_id);
    p.resolve(r);
    p.lease.onReceipt(p, r);
    return true;
  }

  #onAck(m: Msg): void {
    const id = m.subject.slice(this.ackPrefix.length + 1);
    if (id.startsWith(BATCH_MSG_ID_PREFIX)) return this.#onBatchAck(id, m);
    const p = this.pending.get(id);
    if (!p || p.acked) return;
    const code = m.headers?.code ?? 0;
    const ack = pubAckOf(m);
    if (!ack || ack.error || code >= 400 || typeof ack.seq !== "number") {
      // Not stored (no stream, a 503): sent again at its ack deadline.
      this.log.debug("publish not acknowledged; sending again", { event_id: id, code, error: ack?.error?.description });
      p.ackDue = performance.now() + Math.min(1000, this.cfg.publishAckTimeoutMs);
      p.ackFailed = true;
      return;
    }
    p.setAck({ stream: ack.stream ?? "", seq: ack.seq, duplicate: ack.duplicate === true });
    p.lookupDue = performance.now() + this.cfg.receiptTimeoutMs;
  }

  /** onBatchAck is onAck for a batch message: each of its events has the ack. */
  #onBatchAck(key: string, m: Msg): void {
    if (!this.batches.has(key)) return;
    const code = m.headers?.code ?? 0;
    const ack = pubAckOf(m);
    if (!ack || ack.error || code >= 400 || typeof ack.seq !== "number") {
      this.#batchFailed(key, code, ack?.error?.description);
      return;
    }
    const due = performance.now() + this.cfg.receiptTimeoutMs;
    // One ack, frozen, for the batch's events: they were stored as one message.
    const o = { ok: true as const, value: Object.freeze({ stream: ack.stream ?? "", seq: ack.seq, duplicate: ack.duplicate === true }) };
    for (const p of this.#takeBatch(key)) {
      if (p.acked || p.done) continue;
      p.setAckOutcome(o);
      p.lookupDue = due;
    }
  }

  /** takeBatch removes and returns the events of a batch message sent. */
  #takeBatch(key: string): Pending[] {
    const ps = this.batches.get(key)?.ps ?? [];
    this.batches.delete(key);
    for (const p of ps) if (p.batch === key) p.batch = undefined;
    return ps;
  }

  /**
   * batchFailed sends each event of a batch whose publish failed again on its
   * own. No responders means a stream without batch subjects (a ledger older
   * than them): batches stay off for the client's life, and the events go at
   * once. Any other refusal waits as a single event's does.
   */
  #batchFailed(key: string, code: number, error: string | undefined): void {
    const noStream = code === 503;
    if (noStream && !this.#noBatches) {
      this.#noBatches = true;
      this.log.info("LEDGER_IN takes no batches (a ledger older than them): sending events one by one", { error });
    }
    this.log.debug("batch not acknowledged; sending its events again one by one", { batch: key, code, error });
    const now = performance.now();
    for (const p of this.#takeBatch(key)) {
      if (p.acked || p.done) continue;
      if (noStream) this.#resend(p, now);
      else {
        p.ackDue = now + Math.min(1000, this.cfg.publishAckTimeoutMs);
        p.ackFailed = true;
      }
    }
  }

  /**
   * sweep runs a few times a second: it sends again each event whose ack is
   * overdue (same id: JetStream and the ledger deduplicate it), while its lease
   * lasts, and asks for the verdict of each event whose receipt is overdue.
   */
  #sweep(): void {
    const now = performance.now();
    // A batch not acked in time is over: its events still waiting go again alone.
    for (const [key, b] of this.batches) if (now >= b.ackDue) this.#takeBatch(key);
    for (const p of this.pending.values()) {
      if (!p.acked) {
        if (now < p.ackDue) continue;
        this.#resend(p, now);
        continue;
      }
      if (now >= p.lookupDue && !p.lookingUp) void this.#lookUpVerdict(p);
    }
  }

  /** resend publishes p again alone under its id while its lease lasts. */
  #resend(p: Pending, now: number): void {
    if (p.lease.signal.aborted) {
      // Nothing is sent after the lease ended; an attempt may have been stored all the same.
      p.setAck(undefined, new LedgerError("LEASE_LOST", `ledger: event ${p.id} not acknowledged, and not sent again after the lease ended`));
      p.lookupDue = now + this.cfg.receiptTimeoutMs;
      return;
    }
    this.sendAlone(p);
  }

  async #lookUpVerdict(p: Pending): Promise<void> {
    p.lookingUp = true;
    try {
      const ev = (await this.#lookups.lookup(p)).event;
      if (ev && ev.event_id === p.id && ["committed", "stale", "conflict", "gap", "invalid", "duplicate"].includes(ev.verdict)) {
        const l = p.lease;
        const settled = this.settle({
          event_id: p.id,
          task: p.task,
          partition: l.partition,
          version: p.version,
          verdict: ev.verdict,
          reason: ev.reason,
          seq: ev.seq,
          generation: l.generation,
          current_generation: 0,
        });
        if (settled) this.log.info("no receipt; verdict learned from the ledger", { event_id: p.id, verdict: ev.verdict });
        return;
      }
      if (ev === null) this.#publishAgain(p);
    } catch (err) {
      if (this.#closed) return;
      this.log.debug("no receipt, and the ledger could not be asked for the verdict; asking again later", { event_id: p.id, error: String(err) });
    } finally {
      p.lookingUp = false;
    }
    p.lookupDue = performance.now() + this.cfg.receiptTimeoutMs;
  }

  /**
   * publishAgain sends p again after the ledger answered that it has no record
   * of it: its LEDGER_IN message may be lost (a stream that lost acknowledged
   * writes), and the event must not wait for ever. Same id and content, a new
   * Nats-Msg-Id token; if the first copy is only waiting, the ledger answers
   * the second duplicate. It sends on the first such answer, then after 2, 4,
   * 8, ... of them, after the lease ended too: the copy carries the event's
   * generation, so the ledger answers it stale once the lease is gone, and
   * an event JetStream lost late still gets its verdict.
   */
  #publishAgain(p: Pending): void {
    const n = ++p.unknown;
    if ((n & (n - 1)) !== 0 || !p.sent || this.#closed || this.publishAgainOffForTest) return;
    p.resent = true;
    this.nc.publish(p.subject, p.payload, { headers: p.againHeaders(n) });
    this.log.info("the ledger has no record of an event; published it again", { event_id: p.id, task: p.task, version: p.version });
  }

  /**
   * watchReconnects publishes again, after each reconnect of the events'
   * connection to NATS, every event that LEDGER_IN acknowledged and that has
   * no receipt yet. A server that restarted after a power loss or an OS crash
   * may have lost them with its unsynced tail, and a lost event before a kept
   * one makes the kept one wait for a gap verdict. The verdict lookups would
   * find each after receiptTimeoutMs, but they cost one lease-service request
   * an event: with thousands waiting the service refuses most as busy. It
   * ends when the connection closes.
   */
  async #watchReconnects(status: AsyncIterable<Status>): Promise<void> {
    for await (const s of status) {
      if (s.type === "disconnect") this.#connected = false;
      else if (s.type === "reconnect") {
        this.#connected = true;
        const round = ++this.#reconnects;
        this.#resending = this.#resending
          .then(() => this.#resendAcked(round))
          .catch((err) => this.log.warn("publishing again after a reconnect failed", { error: String(err) }));
      }
    }
  }

  /**
   * resendAcked publishes again the events acknowledged and not yet given
   * their receipt: each alone, batched or not, in version order, with its
   * id and content under the Nats-Msg-Id token suffix "-r<reconnects>", so
   * LEDGER_IN stores it even where it remembers the lost copy. The ledger
   * answers duplicate for those it has, which settles them as committed
   * (settle). An event whose lease ended goes all the same: its generation
   * makes the copy stale, as publishAgain explains. A later reconnect ends
   * the round, and its own sends what is left.
   */
  async #resendAcked(round: number): Promise<void> {
    if (round !== this.#reconnects || this.#closed) return;
    const acked = [...this.pending.values()].filter((p) => p.acked && !p.done && p.sent);
    if (acked.length === 0) return;
    acked.sort((a, b) => a.version - b.version);
    let sent = 0;
    for (const p of acked) {
      if (p.done) continue;
      p.resent = true;
      if (!(await this.#resendOne(p, p.copyHeaders(`r${round}`), round))) break;
      sent++;
    }
    this.log.info("reconnected to NATS; published again the events acknowledged before without a receipt", {
      events: sent,
      of: acked.length,
    });
  }

  /**
   * resendOne publishes p with headers and waits for LEDGER_IN's ack,
   * retrying while JetStream is not back yet; false once the client closes,
   * the connection is lost again or a later reconnect began its own round.
   */
  async #resendOne(p: Pending, headers: MsgHdrs, round: number): Promise<boolean> {
    const over = () => this.#closed || !this.#connected || round !== this.#reconnects;
    for (let delay = 50; ; delay = Math.min(2 * delay, 1000)) {
      if (over()) return false;
      let error: string | undefined;
      try {
        const m = await this.nc.request(p.subject, p.payload, { headers, timeout: this.cfg.publishAckTimeoutMs });
        const ack = pubAckOf(m);
        if (ack && !ack.error && typeof ack.seq === "number") return true;
        error = ack?.error?.description ?? `status ${m.headers?.code}`;
      } catch (err) {
        error = String(err);
      }
      if (over()) return false;
      this.log.debug("publishing an event again after the reconnect failed; retrying", { event_id: p.id, error });
      await sleep(delay);
    }
  }

  /** publishAgainOffForTest switches publishAgain off: the negative control of its test. */
  publishAgainOffForTest = false;

  /** dropReceiptsForTest stops receiving receipts, as a disconnected client misses them: for tests of the verdict lookup. */
  dropReceiptsForTest(): void {
    this.#receipts?.unsubscribe();
  }

  /**
   * close ends every lease without releasing it (each expires by its TTL; its
   * signal aborts with CLOSED), ends every wait on a receipt with CLOSED and
   * closes the NATS connection. Calling it again does nothing.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#sweeper);
    const closed = new LedgerError("CLOSED", "ledger: client closed");
    for (const l of this.leases.values()) l?.end(closed, false);
    for (const p of this.pending.values()) p.fail(closed);
    this.pending.clear();
    this.batches.clear();
    this.#receipts?.unsubscribe();
    this.#acks?.unsubscribe();
    await this.nc.close();
    if (this.ctl !== this.nc) await this.ctl.close();
  }
}

/**
 * HeadBatcher asks for the heads of new tasks, many in one request: a lookup
 * that arrives while a request is in flight goes with the next one, so a
 * worker starting on thousands of fresh tasks asks once per round trip.
 */
class HeadBatcher {
  #wait: { task: string; resolve: (h: TaskHead) => void; reject: (e: unknown) => void }[] = [];
  #busy = false;
  constructor(private readonly c: Client) {}

  lookup(task: string): Promise<TaskHead> {
    return new Promise((resolve, reject) => {
      this.#wait.push({ task, resolve, reject });
      if (!this.#busy) {
        this.#busy = true;
        void this.#run();
      }
    });
  }

  async #run(): Promise<void> {
    while (this.#wait.length > 0) {
      const calls = this.#wait.splice(0, 1000);
      try {
        const r = (await this.c.request(this.c.subjects.taskHead(), { tasks: calls.map((x) => x.task) })) as { heads: TaskHead[] };
        if (!Array.isArray(r.heads) || r.heads.length !== calls.length) {
          throw new LedgerError("UNAVAILABLE", `ledger: ${r.heads?.length} heads answered for ${calls.length} tasks`);
        }
        calls.forEach((call, i) => {
          const h = r.heads[i]!;
          if (h.task !== call.task) call.reject(new LedgerError("UNAVAILABLE", `ledger: head of task ${call.task}: the service answered for ${h.task}`));
          else call.resolve(h);
        });
      } catch (err) {
        for (const call of calls) call.reject(err);
      }
    }
    this.#busy = false;
  }
}

/** LookupReply is the ledger's answer to one verdict lookup: the task's head and the event's recorded verdict, or null. */
type LookupReply = TaskHead & { event: EventVerdict | null };

/** MAX_LOOKUP_BYTES bounds a batch of lookups' body: the ledger's limit, NATS's default max_payload. */
const MAX_LOOKUP_BYTES = 1 << 20;

/**
 * LookupBatcher asks for the verdicts of events whose receipt did not come,
 * many in one request, as HeadBatcher does for heads. After a loss thousands of
 * events wait at once; one request each was refused busy by the principal's
 * fair share of the lease service. Against a ledger older than the batch form
 * (it answers invalid, unknown field "lookups") it asks one event at a time.
 */
class LookupBatcher {
  #wait: { p: Pending; resolve: (r: LookupReply) => void; reject: (e: unknown) => void }[] = [];
  #busy = false;
  #single = false;
  #refused = 0;
  #refusedSince = 0;
  constructor(private readonly c: Client) {}

  lookup(p: Pending): Promise<LookupReply> {
    if (this.c.cfg.lookupBatchMax === 1 || this.#single) return this.#one(p);
    return new Promise((resolve, reject) => {
      this.#wait.push({ p, resolve, reject });
      if (!this.#busy) {
        this.#busy = true;
        void this.#run();
      }
    });
  }

  async #run(): Promise<void> {
    while (this.#wait.length > 0) {
      const calls = this.#wait.splice(0, this.#take());
      if (this.#single || !(await this.#batch(calls))) {
        // Against a ledger without the batch form, or a batch refused as invalid: each alone.
        for (const call of calls) this.#one(call.p).then(call.resolve, call.reject);
      }
    }
    this.#busy = false;
  }

  /**
   * batch sends calls in one request and settles them, unless the ledger refused the
   * batch as invalid: then it returns false, and each is asked alone. An older ledger
   * refuses a batch for its size before it reads a field, and a newer one so isolates
   * the lookup it refuses.
   */
  async #batch(calls: { p: Pending; resolve: (r: LookupReply) => void; reject: (e: unknown) => void }[]): Promise<boolean> {
    let r: { heads: LookupReply[] };
    try {
      r = (await this.c.request(this.c.subjects.taskHead(), { lookups: calls.map((x) => lookupOf(x.p)) })) as { heads: LookupReply[] };
      this.#note(undefined, calls.length);
    } catch (err) {
      this.#note(err, calls.length);
      if (unknownBatch(err) && !this.#single) {
        this.#single = true;
        this.c.log.info("the ledger answers no batch of verdict lookups (an older ledger); asking for each event alone", { error: String(err) });
      }
      if (err instanceof ServiceError && err.error === "invalid") return false;
      for (const call of calls) call.reject(err);
      return true;
    }
    if (!Array.isArray(r.heads) || r.heads.length !== calls.length) {
      const err = new LedgerError("UNAVAILABLE", `ledger: ${r.heads?.length} answers to ${calls.length} lookups`);
      for (const call of calls) call.reject(err);
      return true;
    }
    calls.forEach((call, i) => {
      const h = r.heads[i]!;
      if (h.task !== call.p.task) call.reject(new LedgerError("UNAVAILABLE", `ledger: verdict of event ${call.p.id}: the service answered for task ${h.task}`));
      else call.resolve(h);
    });
    return true;
  }

  /** take is how many waiting lookups the next request carries: at most lookupBatchMax, as many as fit MAX_LOOKUP_BYTES and the server's max_payload, at least one. */
  #take(): number {
    const limit = Math.min(MAX_LOOKUP_BYTES, (this.c.ctl.info?.max_payload ?? MAX_LOOKUP_BYTES));
    let size = 16;
    for (let i = 0; i < this.#wait.length; i++) {
      // A payload grows at most twofold as a JSON string; a lookup's other members take at most 512 bytes.
      size += 2 * this.#wait[i]!.p.payload.length + 512;
      if (i === this.c.cfg.lookupBatchMax || (i > 0 && size > limit)) return i;
    }
    return this.#wait.length;
  }

  /** one asks for p's verdict alone, in a lookup's single form. */
  async #one(p: Pending): Promise<LookupReply> {
    try {
      const r = (await this.c.request(this.c.subjects.taskHead(), lookupOf(p))) as LookupReply;
      this.#note(undefined, 1);
      return r;
    } catch (err) {
      this.#note(err, 1);
      throw err;
    }
  }

  /** note logs busy and rate_limited refusals once per run of them, with a count, and the run's end once. */
  #note(err: unknown, n: number): void {
    if (err instanceof ServiceError && (err.error === "busy" || err.error === "rate_limited")) {
      if (this.#refused === 0) {
        this.#refusedSince = performance.now();
        this.c.log.warn("the lease service refuses verdict lookups: this principal is over its share; asking again later", {
          lookups: n,
          error: String(err),
        });
      }
      this.#refused += n;
    } else if (err === undefined && this.#refused > 0) {
      this.c.log.info("verdict lookups served again", { refused: this.#refused, after_ms: Math.round(performance.now() - this.#refusedSince) });
      this.#refused = 0;
    }
  }
}

/** lookupOf is p's verdict lookup. The content goes along, so that the ledger answers committed only for what it stored under the id. */
function lookupOf(p: Pending): { task: string; event_id: string; version: number; type: string; payload: string } {
  return { task: p.task, event_id: p.id, version: p.version, type: p.type, payload: textDecoder.decode(p.payload) };
}

/** unknownBatch tells a ledger's refusal of the batch form itself: an ingest older than it reads "lookups" as an unknown field. */
function unknownBatch(err: unknown): boolean {
  return err instanceof ServiceError && err.error === "invalid" && /unknown field/.test(err.message) && err.message.includes('"lookups"');
}

/** BATCH_MSG_ID_PREFIX starts a batch's Nats-Msg-Id, and the last token of its ack subject. */
const BATCH_MSG_ID_PREFIX = "batch-";

type JsPubAck = { stream?: string; seq?: number; duplicate?: boolean; error?: { description?: string } };

/** pubAckOf reads a JetStream publish ack, undefined when it does not decode. */
function pubAckOf(m: Msg): JsPubAck | undefined {
  try {
    return m.data.length > 0 ? m.json<JsPubAck>() : undefined;
  } catch {
    return undefined;
  }
}

function isTimeout(err: unknown): boolean {
  return err instanceof Error && (err.name === "TimeoutError" || /timeout/i.test(err.message));
}

/** sleep waits ms, or rejects with the signal's reason. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** raceAbort settles with p, or rejects with the signal's reason when it aborts first. */
export function raceAbort<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    p.catch(() => {});
    return Promise.reject(signal.reason);
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      p.catch(() => {});
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e) => {
        signal.removeEventListener("abort", onAbort);
        reject(e);
      },
    );
  });
}
