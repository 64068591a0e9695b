// Batches (docs/contract.md §2, "Batches"): a lease's events leave several
// to a LEDGER_IN message, and each keeps its own verdict.
import { after, before, describe, test as nodeTest } from "node:test";
import assert from "node:assert/strict";
import { connect as natsConnect, type NatsConnection } from "@nats-io/transport-node";

import { connect, type Client, type ConnectOptions, type Lease, type Pending } from "../src/index.js";
import { startLedger, type DevLedger } from "./ledger.js";

const test = (name: string, fn: () => Promise<void>) => nodeTest(name, { timeout: 30_000 }, fn);

let ledger: DevLedger;
let nc: NatsConnection;
const clients: Client[] = [];

before(async () => {
  ledger = await startLedger();
  nc = await natsConnect({ servers: ledger.natsUrl });
});
after(async () => {
  for (const c of clients) await c.close();
  await nc.close();
  await ledger.stop();
});

const quiet = { warn: () => {}, info: () => {}, debug: () => {} };
const timeout = (ms: number) => ({ signal: AbortSignal.timeout(ms) });

async function client(holder: string, extra: Partial<ConnectOptions> = {}): Promise<Client> {
  const c = await connect({ holder, servers: ledger.natsUrl, logger: quiet, ...extra });
  clients.push(c);
  return c;
}

// jsApi sends one JetStream API request, as an operator's tool would.
async function jsApi<T>(api: string, body: unknown): Promise<T> {
  const m = await nc.request(`$JS.API.${api}`, JSON.stringify(body), { timeout: 5000 });
  const r = m.json<T & { error?: { description?: string } }>();
  if (r.error) throw new Error(`${api}: ${r.error.description}`);
  return r;
}

interface StreamInfo {
  config: { subjects: string[] } & Record<string, unknown>;
  state: { last_seq: number };
}

/** inStored is how many messages LEDGER_IN has stored so far (its last sequence: a work queue deletes what was acked). */
async function inStored(): Promise<number> {
  return (await jsApi<StreamInfo>("STREAM.INFO.LEDGER_IN", {})).state.last_seq;
}

/** publishMany publishes n events over tasks, round robin. */
async function publishMany(lease: Lease, tasks: string[], n: number): Promise<Pending[]> {
  const ps: Pending[] = [];
  for (let i = 0; i < n; i++) ps.push(await lease.publishJSON(tasks[i % tasks.length]!, "step", { i }));
  return ps;
}

/** homeTasks are k task ids of one partition. */
function homeTasks(c: Client, prefix: string, k: number): string[] {
  const tasks: string[] = [];
  for (let i = 0; tasks.length < k; i++) {
    const t = `${prefix}-${i}`;
    if (c.partitionOf(t) === c.partitionOf(`${prefix}-0`)) tasks.push(t);
  }
  return tasks;
}

/** startTasks commits a first event of each task, so that later events leave as they are published. */
async function startTasks(lease: Lease, tasks: string[]): Promise<void> {
  for (const t of tasks) await (await lease.publishJSON(t, "start", {})).wait(timeout(10_000));
}

describe("batches", () => {
  // A lease's events published together leave in a few batch messages, and
  // each gets its own verdict: every one is committed, in version order per
  // task.
  // Switch: batchMax 1 (one LEDGER_IN message per event).
  test("events of a lease leave in batches and each is committed", async () => {
    const c = await client("batch.a", { batchLingerMs: 20 });
    const tasks = homeTasks(c, "b", 3);
    const lease = await c.acquire(c.partitionOf(tasks[0]!));
    await startTasks(lease, tasks);
    const before = await inStored();
    const n = 300;
    const receipts = await Promise.all((await publishMany(lease, tasks, n)).map((p) => p.wait(timeout(20_000))));
    const messages = (await inStored()) - before;
    assert.ok(messages < n / 10, `${n} events took ${messages} LEDGER_IN messages`);
    for (const t of tasks) {
      const versions = receipts.filter((r) => r.task === t).map((r) => r.version);
      assert.deepEqual(versions, Array.from({ length: versions.length }, (_, i) => i + 2), `task ${t}: versions in publish order`);
      assert.equal((await c.taskHead(t)).version, 1 + versions.length);
    }
    assert.ok(receipts.every((r) => r.verdict === "committed"));
    await lease.release(timeout(5000));
  });

  // An event with no other in its linger goes as a batch of one, so a task's
  // versions keep to one form and to one of the ingest's two consumers of
  // the partition. Only an event larger than batchMaxBytes goes alone.
  // Switch: #flush sending a lone event alone (the rule before).
  test("a lone event goes as a batch of one", async () => {
    const seen: string[] = [];
    const sub = nc.subscribe("ledger.in.batch.c.>", { callback: (_err, m) => void seen.push(m.subject) });
    await nc.flush();
    try {
      const c = await client("batch.c", { batchMaxBytes: 4096 });
      const task = "lone";
      const lease = await c.acquire(c.partitionOf(task));
      await (await lease.publishJSON(task, "start", { n: 1 })).wait(timeout(10_000));
      await (await lease.publishJSON(task, "step", { blob: "x".repeat(8192) })).wait(timeout(10_000));
      const p = c.partitionOf(task);
      assert.deepEqual(seen, [`ledger.in.batch.c.${p}`, `ledger.in.batch.c.${p}.${task}`],
        "the lone event as a batch, the large one alone");
      assert.equal((await c.taskHead(task)).version, 2);
      await lease.release(timeout(5000));
    } finally {
      sub.unsubscribe();
    }
  });

  // Against a ledger whose LEDGER_IN has no batch subjects (one older than
  // batches), the batch publish gets no responders and its events are sent
  // again alone; the client sends no batch again. The ack deadline is far
  // off, so only that fallback can give the events their verdicts in time.
  // Switch: #batchFailed doing nothing (no verdict comes before the deadline).
  test("falls back to single events when LEDGER_IN takes no batches", async () => {
    const info = await jsApi<StreamInfo>("STREAM.INFO.LEDGER_IN", {});
    const batchSubject = /^ledger\.in\.[^.]+\.[^.]+\.[^.]+$/;
    const old = info.config.subjects.filter((s) => !batchSubject.test(s));
    assert.ok(old.length < info.config.subjects.length, `no batch subjects in ${info.config.subjects}`);
    await jsApi("STREAM.UPDATE.LEDGER_IN", { ...info.config, subjects: old });
    try {
      const c = await client("batch.b", { batchLingerMs: 20, publishAckTimeoutMs: 60_000 });
      const task = "old";
      const lease = await c.acquire(c.partitionOf(task));
      await startTasks(lease, [task]);
      const before = await inStored();
      const n = 50;
      const receipts = await Promise.all((await publishMany(lease, [task], n)).map((p) => p.wait(timeout(15_000))));
      assert.ok(receipts.every((r) => r.verdict === "committed"));
      assert.equal((await c.taskHead(task)).version, 1 + n);
      assert.equal((await inStored()) - before, n, "one message per event, none of them a batch");
      assert.equal(c.batching, false, "batches stay off for the client's life");
      await lease.release(timeout(5000));
    } finally {
      await jsApi("STREAM.UPDATE.LEDGER_IN", info.config);
    }
  });
});
