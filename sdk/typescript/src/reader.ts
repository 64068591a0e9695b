import { connect as natsConnect } from "@nats-io/transport-node";
import type { NatsConnection, NodeConnectionOptions, Subscription } from "@nats-io/transport-node";

import { LedgerError } from "./errors.js";
import { natsOptions } from "./nats.js";
import { BUCKET_TASKS, validTask, type Projection } from "./wire.js";

/** WatchOptions end a watch. */
export interface WatchOptions {
  signal?: AbortSignal;
  /** Bounds the first read; default 5000 ms. */
  timeoutMs?: number;
}

/**
 * Reader reads the projections (KV bucket ledger_tasks) the way contract §9
 * lets a confined reader: a task's value by direct get, its later changes by
 * subscribing to the bucket's subjects, with core NATS. It never creates a
 * consumer. In an authenticated deployment the connection needs a reader's
 * credential.
 */
export class Reader {
  /** A reader on nc; close() leaves nc open. connectReader opens a reader with a connection of its own. */
  constructor(
    readonly nc: NatsConnection,
    private readonly owned = false,
  ) {}

  /** close closes the connection when the reader opened it (connectReader). */
  async close(): Promise<void> {
    if (this.owned) await this.nc.close();
  }

  /** projection returns a task's current value, or null when it has none yet. */
  async projection(task: string, opts: { timeoutMs?: number } = {}): Promise<Projection | null> {
    if (!validTask(task)) throw new LedgerError("INVALID", `ledger: task id ${JSON.stringify(task)} is not 1..128 of [A-Za-z0-9_-]`);
    const m = await this.nc.request(`$JS.API.DIRECT.GET.KV_${BUCKET_TASKS}.$KV.${BUCKET_TASKS}.${task}`, undefined, {
      timeout: opts.timeoutMs ?? 5000,
    });
    const code = m.headers?.code ?? 0;
    if (code === 404) return null;
    if (code >= 400) throw new LedgerError("UNAVAILABLE", `ledger: projection of ${task}: ${code} ${m.headers?.description ?? ""}`);
    if (isDeleted(m.headers?.get("KV-Operation"))) return null;
    return m.json<Projection>();
  }

  /**
   * watchTask yields a task's value now (if it has one) and then each time its
   * version moves forward, until the signal ends. It subscribes before the
   * first read, so no change falls between; a value that arrives twice or out
   * of order is not yielded again.
   */
  async *watchTask(task: string, opts: WatchOptions = {}): AsyncGenerator<Projection> {
    if (!validTask(task)) throw new LedgerError("INVALID", `ledger: task id ${JSON.stringify(task)} is not 1..128 of [A-Za-z0-9_-]`);
    const queue: Projection[] = [];
    let wake: (() => void) | undefined;
    const sub: Subscription = this.nc.subscribe(`$KV.${BUCKET_TASKS}.${task}`, {
      callback: (err, m) => {
        if (err || isDeleted(m.headers?.get("KV-Operation")) || m.data.length === 0) return;
        try {
          queue.push(m.json<Projection>());
        } catch {
          return; // not a value of ours
        }
        wake?.();
      },
    });
    const onAbort = () => wake?.();
    opts.signal?.addEventListener("abort", onAbort);
    try {
      await this.nc.flush();
      let version = 0;
      const first = await this.projection(task, { timeoutMs: opts.timeoutMs });
      if (first) {
        version = first.version;
        yield first;
      }
      while (!opts.signal?.aborted) {
        const v = queue.shift();
        if (v) {
          if (v.version > version) {
            version = v.version;
            yield v;
          }
          continue;
        }
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
    } finally {
      opts.signal?.removeEventListener("abort", onAbort);
      sub.unsubscribe();
    }
  }
}

function isDeleted(op: string | undefined): boolean {
  return op === "DEL" || op === "PURGE";
}

/** ReaderOptions configure connectReader. */
export interface ReaderOptions {
  /** NATS servers; default "127.0.0.1:4222". */
  servers?: string | string[];
  /** The reader's inbox prefix: _INBOX_<reader> in an authenticated deployment (docs/security.md). */
  inboxPrefix?: string;
  /** More options of the connection: the reader's credentials, TLS. */
  nats?: Partial<NodeConnectionOptions>;
}

/**
 * connectReader opens a NATS connection for reading projections, closed by Reader.close().
 * It reconnects for ever unless opts.nats.maxReconnectAttempts says otherwise, as connect's do.
 */
export async function connectReader(opts: ReaderOptions = {}): Promise<Reader> {
  const nc = await natsConnect({
    ...natsOptions(opts.servers, opts.nats),
    ...(opts.inboxPrefix ? { inboxPrefix: opts.inboxPrefix } : {}),
  });
  return new Reader(nc, true);
}
