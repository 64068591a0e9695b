import { after, before, describe, test as nodeTest } from "node:test";
import assert from "node:assert/strict";
import { connect as natsConnect } from "@nats-io/transport-node";

import { connect, LedgerError, RejectedError, type Client } from "../src/index.js";
import { startProxy } from "./faultproxy.js";
import { startLedger, type DevLedger } from "./ledger.js";

// Every test is bounded: one that hangs fails rather than stalling the run.
const test = (name: string, fn: () => Promise<void>) => nodeTest(name, { timeout: 20_000 }, fn);

let ledger: DevLedger;
const clients: Client[] = [];

before(async () => {
  ledger = await startLedger();
});
after(async () => {
  for (const c of clients) await c.close();
  await ledger.stop();
});

/**
 * leaseServiceBack waits until the client's lease connection answers again
 * after a cut: nats.js drops what is sent while it reconnects.
 */
async function leaseServiceBack(c: Client, task: string): Promise<void> {
  const asked = () => c.request(c.subjects.taskHead(), { task }, undefined, 250).then(() => true, () => false);
  await untilTrue(asked, 10_000, "the lease service answered the client again");
}

/** reconnecting: a client through proxy that reconnects at once, for ever, and looks nothing up. */
function reconnecting(proxy: string): Partial<Parameters<typeof connect>[0]> {
  return {
    servers: proxy,
    ttlMs: 60_000,
    receiptTimeoutMs: 3_600_000,
    nats: { reconnectTimeWait: 50, maxReconnectAttempts: -1, ignoreClusterUpdates: true },
  };
}

async function client(holder: string, extra: Partial<Parameters<typeof connect>[0]> = {}): Promise<Client> {
  const c = await connect({ holder, servers: ledger.natsUrl, logger: quiet, ...extra });
  clients.push(c);
  return c;
}

// jsApi sends one JetStream API request, as an operator's tool would.
async function jsApi(nc: Awaited<ReturnType<typeof natsConnect>>, api: string, body: unknown): Promise<Record<string, unknown>> {
  const m = await nc.request(`$JS.API.${api}`, JSON.stringify(body), { timeout: 5000 });
  const r = m.json<Record<string, unknown> & { error?: { description?: string } }>();
  if (r.error) throw new Error(`${api}: ${r.error.description}`);
  return r;
}

/**
 * pauseIngest pauses the ingest's consumers of a partition, so the ingest
 * cannot see an event before the test loses it from LEDGER_IN; the function
 * it returns resumes them.
 */
async function pauseIngest(nc: Awaited<ReturnType<typeof natsConnect>>, partition: number): Promise<() => Promise<void>> {
  const names = ((await jsApi(nc, "CONSUMER.NAMES.LEDGER_IN", {})).consumers as string[]).filter((n) =>
    n.startsWith(`ingest-${partition}-`),
  );
  assert.ok(names.length > 0, "the partition has an ingest consumer");
  const until = new Date(Date.now() + 60_000).toISOString();
  for (const n of names) await jsApi(nc, `CONSUMER.PAUSE.LEDGER_IN.${n}`, { pause_until: until });
  return async () => {
    for (const n of names) await jsApi(nc, `CONSUMER.PAUSE.LEDGER_IN.${n}`, {});
  };
}

const quiet = { warn: () => {}, info: () => {}, debug: () => {} };
const timeout = (ms: number) => ({ signal: AbortSignal.timeout(ms) });

/** untilTrue waits for cond, asking again every 50 ms, for at most ms. */
async function untilTrue(cond: () => Promise<boolean>, ms: number, what: string): Promise<void> {
  const deadline = performance.now() + ms;
  while (!(await cond())) {
    if (performance.now() > deadline) assert.fail(`${what} within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("a worker", () => {
  test("acquires, publishes pipelined and learns each commit", async () => {
    const c = await client("reports.a1");
    assert.equal(c.partitions, ledger.partitions, "the partition count comes from the lease service");
    const task = "report-commit";
    const lease = await c.acquire(c.partitionOf(task));
    assert.equal(lease.generation, 1);
    const sent = [];
    for (let i = 1; i <= 50; i++) sent.push(await lease.publishJSON(task, "step", { step: i }));
    const receipts = await Promise.all(sent.map((p) => p.wait(timeout(10_000))));
    assert.deepEqual(
      receipts.map((r) => r.version),
      Array.from({ length: 50 }, (_, i) => i + 1),
      "versions 1..50 in publish order, all committed",
    );
    assert.ok(receipts.every((r) => r.verdict === "committed" && r.generation === 1 && r.seq > 0));
    for (const p of sent) {
      const ack = await p.pubAck();
      assert.ok(ack === undefined || (ack.stream === "LEDGER_IN" && ack.seq > 0), "stored in LEDGER_IN, or the receipt came first");
      assert.equal(await p.assigned(), p.version);
    }
    const head = await c.taskHead(task);
    assert.equal(head.version, 50);
    assert.equal(head.partition, lease.partition);
    await lease.release(timeout(5000));
    assert.equal(lease.signal.reason.code, "RELEASED");

    const next = await c.acquire(lease.partition);
    assert.equal(next.generation, 2, "a released lease keeps its generation; the next acquire bumps it");
    const p = await next.publishJSON(task, "completed", { done: true });
    assert.equal((await p.wait(timeout(5000))).version, 51, "a new lease resumes the task from its head");
    await next.release(timeout(5000));
  });

  test("refuses hostile input before sending it", async () => {
    const c = await client("reports.a2");
    const lease = await c.acquire(c.partitionOf("ok"));
    for (const [task, type, payload] of [
      ["bad task!", "t", "{}"],
      ["ok", "bad type with spaces", "{}"],
      ["ok", "t", "{not json"],
    ] as const) {
      await assert.rejects(lease.publish(task, type, payload), (e: LedgerError) => e.code === "INVALID");
    }
    await assert.rejects(lease.publishJSON("ok", "t", { n: 10n }), (e: LedgerError) => e.code === "INVALID");
    await assert.rejects(c.acquire(lease.partition), (e: LedgerError) => e.code === "LEASE_ACTIVE");
    await assert.rejects(c.acquire(ledger.partitions), (e: LedgerError) => e.code === "INVALID", "a partition the deployment does not have");
    await assert.rejects(connect({ holder: "no-dot", servers: ledger.natsUrl }), (e: LedgerError) => e.code === "INVALID");
    await lease.release(timeout(5000));
  });

  test("a task pinned to another partition sends nothing", async () => {
    const c = await client("reports.a3");
    const task = "report-pinned";
    const home = c.partitionOf(task);
    const l1 = await c.acquire(home);
    await (await l1.publishJSON(task, "x", {})).wait(timeout(5000));
    const other = await c.acquire((home + 1) % c.partitions);
    const p = await other.publishJSON(task, "x", {});
    await assert.rejects(p.receipt(), (e: LedgerError) => e.code === "WRONG_PARTITION");
    assert.equal(await p.assigned(), 0, "it never got a version");
    await assert.rejects(other.publishJSON(task, "x", {}), (e: LedgerError) => e.code === "WRONG_PARTITION", "later publishes fail at once");
    await l1.release(timeout(5000));
    await other.release(timeout(5000));
  });
});

describe("a zombie", () => {
  test("an earlier incarnation of the same holder gets stale and loses its lease", async () => {
    // A long TTL: its next renewal (which would be refused) is far off, so the stale receipt decides.
    const old = await client("reports.z1", { ttlMs: 60_000 });
    const task = "report-zombie";
    const lease = await old.acquire(old.partitionOf(task));
    await (await lease.publishJSON(task, "running", { pct: 10 })).wait(timeout(5000));

    const restarted = await client("reports.z1"); // the same holder id, a new process
    const fresh = await restarted.acquire(lease.partition);
    assert.equal(fresh.generation, lease.generation + 1, "the same holder re-acquiring fences its earlier incarnation");

    const late = await lease.publishJSON(task, "running", { pct: 20 }); // its local deadline still holds
    await assert.rejects(late.wait(timeout(5000)), (e: RejectedError) => {
      assert.equal(e.code, "REJECTED");
      assert.equal(e.verdict, "stale");
      assert.equal(e.reason, "superseded");
      assert.equal(e.receipt.current_generation, fresh.generation);
      return true;
    });
    const reason = await lease.lost;
    assert.equal(reason.code, "LEASE_LOST");
    assert.match(reason.message, /came back stale/);
    assert.ok(lease.signal.aborted);
    await assert.rejects(lease.publishJSON(task, "running", {}), (e: LedgerError) => e.code === "LEASE_LOST");
    assert.equal((await restarted.taskHead(task)).version, 1, "nothing of the old generation was committed");
    await fresh.release(timeout(5000));
  });

  test("an earlier incarnation that does not publish learns of the loss from its refused renewal", async () => {
    const old = await client("reports.z5", { ttlMs: 600 });
    const lease = await old.acquire(7);
    const restarted = await client("reports.z5", { ttlMs: 600 });
    const fresh = await restarted.acquire(7);
    assert.equal(fresh.generation, lease.generation + 1);
    const reason = await lease.lost;
    assert.equal(reason.code, "LEASE_LOST");
    assert.match(reason.message, /renewal refused/);
    assert.ok(performance.now() < lease.deadlineMono, "before its local deadline: the refusal ends it at once");
    await fresh.release(timeout(5000));
  });

  test("a worker whose renewals stop loses its lease at the local deadline, before a standby can take over", async () => {
    const ttlMs = 600;
    const a = await client("reports.z2", { ttlMs });
    const b = await client("reports.z3", { ttlMs });
    const lease = await a.acquire(5);
    const deadline = lease.deadlineMono;
    lease.pauseRenewalsForTest();
    const reason = await lease.lost;
    const at = performance.now();
    assert.equal(reason.code, "LEASE_LOST");
    assert.match(reason.message, /local deadline/);
    // The wall clock is checked too, in whole milliseconds: it may end the lease a millisecond or two sooner.
    assert.ok(at >= deadline - 5, `not before the local deadline: ${Math.round(deadline - at)} ms before it`);
    assert.ok(at < deadline + 200, `at the local deadline, not ${Math.round(at - deadline)} ms after`);
    await assert.rejects(lease.publishJSON("report-z2", "x", {}), (e: LedgerError) => e.code === "LEASE_LOST");
    const taken = await b.acquireWait(5, timeout(5000));
    assert.equal(taken.generation, lease.generation + 1);
    await taken.release(timeout(5000));
  });

  test("a worker paused past its TTL refuses to publish when it runs again, even before its timers run", async () => {
    const ttlMs = 400;
    const a = await client("reports.z4", { ttlMs });
    const lease = await a.acquire(6);
    const until = performance.now() + ttlMs * 1.5;
    while (performance.now() < until) {
      // A paused process: no timer, no renewal, no I/O runs.
    }
    assert.ok(!lease.signal.aborted, "the deadline timer has not run yet");
    await assert.rejects(lease.publishJSON("report-z4", "x", {}), (e: LedgerError) => {
      assert.equal(e.code, "LEASE_LOST");
      assert.match(e.message, /local deadline/);
      return true;
    });
  });
});

describe("a standby", () => {
  test("takes over within a poll when the primary releases, and resumes the task", async () => {
    const task = "report-standby";
    const a = await client("reports.s1", { ttlMs: 2000 });
    const b = await client("reports.s2", { ttlMs: 2000 });
    const partition = a.partitionOf(task);
    const la = await a.acquire(partition);
    for (let i = 1; i <= 3; i++) await (await la.publishJSON(task, "running", { step: i })).wait(timeout(5000));

    const waiting = b.acquireWait(partition, timeout(10_000));
    await new Promise((r) => setTimeout(r, 300));
    const released = performance.now();
    await la.release(timeout(5000));
    const lb = await waiting;
    const took = performance.now() - released;
    assert.equal(lb.generation, la.generation + 1);
    assert.ok(took < 1000, `took over ${Math.round(took)} ms after the release, within a poll rather than a TTL`);
    assert.equal((await b.taskHead(task)).version, 3, "resumes after the old holder's last version");
    const r = await (await lb.publishJSON(task, "completed", { step: 4 })).wait(timeout(5000));
    assert.equal(r.version, 4);
    await lb.release(timeout(5000));
  });

  test("takes over after the TTL when the primary vanishes without releasing", async () => {
    const a = await client("reports.s3", { ttlMs: 500 });
    const b = await client("reports.s4", { ttlMs: 500 });
    const la = await a.acquire(9);
    await a.close(); // like kill -9: no release, the lease expires by its TTL
    assert.equal(la.signal.reason.code, "CLOSED");
    const lb = await b.acquireWait(9, timeout(5000));
    assert.equal(lb.generation, la.generation + 1);
    await lb.release(timeout(5000));
  });
});

describe("receipts", () => {
  test("a lost receipt is replaced by the verdict the ledger recorded", async () => {
    const c = await client("reports.r1", { receiptTimeoutMs: 300 });
    const task = "report-lost-receipt";
    const lease = await c.acquire(c.partitionOf(task));
    c.dropReceiptsForTest();
    const p = await lease.publishJSON(task, "running", {});
    const r = await p.wait(timeout(5000));
    assert.equal(r.verdict, "committed");
    assert.equal(r.current_generation, 0, "a looked-up verdict, not a receipt");
    assert.ok(r.seq > 0);
    await lease.release(timeout(5000));
  });

  test("an event lost from LEDGER_IN before the ledger saw it is published again and committed", async () => {
    const c = await client("reports.r3", { receiptTimeoutMs: 300 });
    const task = "report-lost-event";
    const partition = c.partitionOf(task);
    const lease = await c.acquire(partition, timeout(5000));
    const nc = await natsConnect({ servers: ledger.natsUrl });
    try {
      const resume = await pauseIngest(nc, partition);
      const p = await lease.publishJSON(task, "completed", { step: 1 });
      const ack = await p.pubAck();
      assert.ok(ack);
      await jsApi(nc, "STREAM.MSG.DELETE.LEDGER_IN", { seq: ack.seq });
      await resume();
      const r = await p.wait(timeout(10_000));
      assert.equal(r.verdict, "committed");
      assert.equal(r.event_id, p.id);
      assert.equal(r.version, 1);
    } finally {
      await nc.close();
    }
    await lease.release(timeout(5000));
  });

  // An event lost from LEDGER_IN with the server's tail is published again
  // when the client reconnects, without waiting for a verdict lookup: with
  // thousands of events waiting after a loss the lease service refuses most
  // lookups as busy. The receipt timeout is an hour, so only the reconnect
  // can send it again. The Go twin: TestEventLostFromLedgerInIsPublishedAgainOnReconnect.
  // Switch: no #resendAcked call in #watchReconnects (src/client.ts): no verdict in 10 s.
  test("an event lost from LEDGER_IN is published again when the client reconnects, and committed", async () => {
    const proxy = await startProxy(ledger.natsUrl);
    const c = await client("reports.r4", reconnecting(proxy.url));
    const task = "report-lost-on-reconnect";
    const lease = await c.acquire(c.partitionOf(task), timeout(5000));
    await (await lease.publishJSON(task, "running", { step: 1 })).wait(timeout(10_000));
    const nc = await natsConnect({ servers: ledger.natsUrl });
    try {
      const resume = await pauseIngest(nc, lease.partition);
      const lost = await lease.publishJSON(task, "completed", { step: 2 });
      const ack = await lost.pubAck();
      assert.ok(ack);
      await jsApi(nc, "STREAM.MSG.DELETE.LEDGER_IN", { seq: ack.seq });
      proxy.cut(); // as the server's restart after the loss does
      assert.ok(proxy.dropped > 0, "the cut reached the client");
      proxy.restore();
      await resume();
      const r = await lost.wait(timeout(10_000));
      assert.equal(r.verdict, "committed");
      assert.equal(r.event_id, lost.id);
      assert.equal(r.version, 2);
      await leaseServiceBack(c, task);
      const head = await c.taskHead(task);
      assert.equal(head.version, 2);
      assert.equal(head.seq, r.seq, "the task's head is the lost event's row");
      await lease.release(timeout(5000));
    } finally {
      await nc.close();
      await proxy.close();
    }
  });

  // The receipt of an event decided while its client was cut off is lost;
  // the copy sent on the reconnect is answered duplicate / same_event_id,
  // which settles the event as committed with its seq, as a lookup would.
  // Switch: no duplicate-to-committed in Client.settle: the verdict is duplicate.
  test("the duplicate answer to the client's own copy after a reconnect settles the event as committed", async () => {
    const proxy = await startProxy(ledger.natsUrl);
    const c = await client("reports.r5", reconnecting(proxy.url));
    const task = "report-receipt-missed-offline";
    const lease = await c.acquire(c.partitionOf(task), timeout(5000));
    const nc = await natsConnect({ servers: ledger.natsUrl });
    try {
      const resume = await pauseIngest(nc, lease.partition);
      const p = await lease.publishJSON(task, "completed", {});
      assert.ok(await p.pubAck());
      proxy.cut();
      await resume();
      const committed = async () => {
        const m = await nc.request(c.subjects.taskHead(), JSON.stringify({ task }), { timeout: 5000 });
        return m.json<{ version: number }>().version === 1;
      };
      await untilTrue(committed, 10_000, "the event committed while its client was cut off");
      proxy.restore();
      const r = await p.wait(timeout(10_000));
      assert.equal(r.verdict, "committed");
      assert.equal(r.reason, "");
      assert.equal(r.current_generation, lease.generation, "a receipt, not a looked-up verdict");
      assert.ok(r.seq > 0);
      await leaseServiceBack(c, task);
      await lease.release(timeout(5000));
    } finally {
      await nc.close();
      await proxy.close();
    }
  });

  // An outage longer than nats.js's 10 reconnect attempts: the client keeps
  // trying (the SDK's maxReconnectAttempts -1), and an event published before
  // it gets its verdict after it. The ingest is paused so the verdict cannot
  // come before the cut. reconnectTimeWait 50 ms makes 10 attempts quick.
  // Switch: nats.js's default, maxReconnectAttempts: 10 in natsOptions (src/nats.ts):
  // both connections close after 20 refused dials and the event has no verdict in 10 s.
  test("a client outlives an outage longer than 10 reconnect attempts, and its event gets its verdict", async () => {
    const proxy = await startProxy(ledger.natsUrl);
    const c = await client("reports.r6", {
      servers: proxy.url,
      ttlMs: 60_000,
      receiptTimeoutMs: 3_600_000,
      nats: { reconnectTimeWait: 50, ignoreClusterUpdates: true },
    });
    const task = "report-long-outage";
    const lease = await c.acquire(c.partitionOf(task), timeout(5000));
    const nc = await natsConnect({ servers: ledger.natsUrl });
    try {
      const resume = await pauseIngest(nc, lease.partition);
      const p = await lease.publishJSON(task, "completed", { step: 1 });
      assert.ok(await p.pubAck());
      proxy.cut();
      assert.ok(proxy.dropped > 0, "the cut reached the client");
      // 10 attempts of each of the two connections, then more: or the connections closed.
      const attempts = 2 * 10 + 4;
      const pastTen = async () => proxy.refused >= attempts || (c.nc.isClosed() && c.ctl.isClosed());
      await untilTrue(pastTen, 15_000, `${attempts} reconnect attempts refused`);
      proxy.restore();
      await resume();
      const r = await p.wait(timeout(10_000));
      assert.equal(r.verdict, "committed");
      assert.equal(r.event_id, p.id);
      assert.ok(!c.nc.isClosed() && !c.ctl.isClosed(), "both connections are open");
      await leaseServiceBack(c, task);
      await lease.release(timeout(5000));
    } finally {
      await nc.close();
      await proxy.close();
    }
  });

  test("a refused version needs a resync", async () => {
    const c = await client("reports.r2");
    const task = "report-resync";
    const lease = await c.acquire(c.partitionOf(task));
    await (await lease.publishJSON(task, "running", {})).wait(timeout(5000));
    // Another writer takes version 2 first (same holder, its own raw publish).
    const nc = await natsConnect({ servers: ledger.natsUrl });
    const h = (await import("@nats-io/transport-node")).headers();
    h.set("Nats-Msg-Id", (await import("../src/index.js")).ulid());
    h.set("Ledger-Generation", String(lease.generation));
    h.set("Ledger-Version", "2");
    h.set("Ledger-Type", "other");
    await nc.request(`ledger.in.reports.r2.${lease.partition}.${task}`, '{"other":true}', { headers: h, timeout: 5000 });
    await nc.close();
    for (;;) {
      if ((await c.taskHead(task)).version === 2) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    const p = await lease.publishJSON(task, "running", { mine: true });
    await assert.rejects(p.wait(timeout(5000)), (e: RejectedError) => e.verdict === "conflict" && e.reason === "version_taken");
    await assert.rejects(lease.publishJSON(task, "running", {}), (e: LedgerError) => e.code === "RESYNC_NEEDED");
    assert.equal(await lease.resyncTask(task, timeout(5000)), 2);
    assert.equal((await (await lease.publishJSON(task, "running", {})).wait(timeout(5000))).version, 3);
    await lease.release(timeout(5000));
  });
});

describe("a snapshot task", () => {
  test("publishSnapshot makes a snapshot task, whose projection is the newest snapshot and whose kind never changes", async () => {
    const c = await client("sensors.s1");
    const task = "gauge-ts";
    const lease = await c.acquire(c.partitionOf(task));
    const first = await (await lease.publishSnapshot(task, "reading", JSON.stringify({ temp: 20, unit: "C" }))).wait(timeout(5000));
    assert.equal(first.verdict, "committed");
    const second = await (await lease.publishSnapshot(task, "reading", JSON.stringify({ temp: 23 }))).wait(timeout(5000));
    assert.equal(second.version, 2);
    const head = await c.taskHead(task);
    assert.equal(head.kind, "snapshot", "the first event chose the kind");
    assert.equal(head.version, 2);
    let v = await c.reader.projection(task);
    for (let i = 0; i < 50 && v?.version !== 2; i++) {
      await new Promise((r) => setTimeout(r, 100));
      v = await c.reader.projection(task);
    }
    assert.equal(v?.kind, "snapshot");
    assert.deepEqual(v?.data, { temp: 23 }, "the newest snapshot, not a merge with the one before");

    const plain = await lease.publishJSON(task, "reading", { temp: 24 });
    await assert.rejects(plain.wait(timeout(5000)), (e: RejectedError) => {
      assert.equal(e.verdict, "invalid");
      assert.equal(e.reason, "wrong_kind", "a task's kind never changes");
      return true;
    });
    await lease.release(timeout(5000));
  });
});

describe("the reader", () => {
  test("reads a projection by direct get and follows it without a consumer", async () => {
    const c = await client("reports.p1");
    const task = "report-read";
    assert.equal(await c.reader.projection(task), null, "no projection yet");
    const ac = new AbortController();
    const seen: number[] = [];
    const watching = (async () => {
      for await (const v of c.reader.watchTask(task, { signal: ac.signal })) {
        seen.push(v.version);
        if (v.version === 3) ac.abort();
      }
    })();
    const lease = await c.acquire(c.partitionOf(task));
    await (await lease.publishJSON(task, "running", { a: 1 })).wait(timeout(5000));
    await (await lease.publishJSON(task, "running", { b: 2 })).wait(timeout(5000));
    await (await lease.publishJSON(task, "completed", { a: null })).wait(timeout(5000));
    await watching;
    assert.ok(seen.length >= 1 && seen.at(-1) === 3, `saw versions ${seen}`);
    assert.deepEqual(seen, [...seen].sort((x, y) => x - y), "only forward");
    const v = await c.reader.projection(task);
    assert.equal(v?.version, 3);
    assert.equal(v?.status, "completed");
    assert.deepEqual(v?.data, { b: 2 }, "payloads folded as JSON merge patches");
    await lease.release(timeout(5000));
  });
});
