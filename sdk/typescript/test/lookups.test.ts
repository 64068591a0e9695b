import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect as natsConnect, headers, type Msg } from "@nats-io/transport-node";

import { connect, type Client, type Pending } from "../src/index.js";
import { startLedger, type DevLedger } from "./ledger.js";

let ledger: DevLedger;
const clients: Client[] = [];

before(async () => {
  ledger = await startLedger();
});
after(async () => {
  for (const c of clients) await c.close();
  await ledger.stop();
});

const quiet = { warn: () => {}, info: () => {}, debug: () => {} };

/** LOOKUP_BATCH_MAX is the client's lookupBatchMax in this test; 1 switches batches off. */
const LOOKUP_BATCH_MAX: number | undefined = undefined;

// After a loss many events wait for their verdicts at once. Their lookups go
// together in a few requests, within the principal's share of the lease
// service: every event learns it is committed and no request is refused.
// The Go twin, at 2000 events: TestThousandsOfLookupsGoInFewRequestsAndNoneIsRefused.
// Switch: LOOKUP_BATCH_MAX = 1 (a request per event: refused busy).
test("hundreds of lost receipts are looked up in a few requests, none refused", { timeout: 60_000 }, async () => {
  const principal = "lookups";
  const spy = await natsConnect({ servers: ledger.natsUrl });
  let requests = 0;
  let lookups = 0;
  let refused = 0;
  spy.subscribe("ledger.task.head", {
    callback: (_err, m) => {
      const req = m.json<{ event_id?: string; lookups?: unknown[] }>();
      if (req.lookups) {
        requests++;
        lookups += req.lookups.length;
      } else if (req.event_id) {
        requests++;
        lookups++;
      }
    },
  });
  spy.subscribe(`_INBOX.${principal}.>`, {
    callback: (_err, m) => {
      if (m.headers?.get("Nats-Service-Error-Code") === "429") refused++;
    },
  });
  await spy.flush();
  try {
    const n = 600;
    const c = await connect({
      holder: `${principal}.1`,
      servers: ledger.natsUrl,
      logger: quiet,
      receiptTimeoutMs: 1000,
      maxInFlight: n,
      ...(LOOKUP_BATCH_MAX ? { lookupBatchMax: LOOKUP_BATCH_MAX } : {}),
    });
    clients.push(c);
    const lease = await c.acquire(0, { signal: AbortSignal.timeout(5000) });
    c.dropReceiptsForTest();
    const ps: Pending[] = [];
    for (let i = 0; i < n; i++) ps.push(await lease.publishJSON(`lost-${i % 20}`, "step", { i }));
    for (const p of ps) {
      const r = await p.wait({ signal: AbortSignal.timeout(45_000) });
      assert.equal(r.verdict, "committed");
      assert.equal(r.current_generation, 0, "a looked-up verdict, not a receipt");
    }
    await spy.flush();
    console.log(`${n} events: ${lookups} lookups in ${requests} requests, ${refused} refused`);
    assert.ok(lookups >= n, `${lookups} lookups for ${n} events`);
    assert.equal(refused, 0, "lookups refused as over the principal's share");
    assert.ok(requests <= n / 20, `${lookups} lookups took ${requests} requests`);
  } finally {
    await spy.close();
  }
});

/**
 * fakeOldLedger serves a lease service under prefix as a ledger older than the
 * batch form of lookups does: "lookups" is an unknown field, and each single
 * lookup answers committed with seq 7. A stream takes the prefix's events, so
 * publishes are acknowledged; nothing judges them, so no receipt comes.
 */
async function fakeOldLedger(prefix: string): Promise<{ counts: () => { batches: number; singles: number }; close: () => Promise<void> }> {
  const nc = await natsConnect({ servers: ledger.natsUrl });
  const stream = `${prefix.toUpperCase()}_IN`;
  const created = (await nc.request(`$JS.API.STREAM.CREATE.${stream}`, JSON.stringify({ name: stream, subjects: [`${prefix}.in.>`], storage: "memory" }), { timeout: 5000 })).json<{ error?: unknown }>();
  assert.equal(created.error, undefined);
  let batches = 0;
  let singles = 0;
  const grant = (m: Msg) => {
    const r = m.json<{ partition: number }>();
    const holder = m.subject.split(".").slice(-2).join(".");
    m.respond(JSON.stringify({ partition: r.partition, holder, generation: 1, expires_at: new Date(Date.now() + 3_600_000).toISOString(), ttl_ms: 3000 }));
  };
  nc.subscribe(`${prefix}.lease.acquire.>`, { callback: (_err, m) => grant(m) });
  nc.subscribe(`${prefix}.lease.renew.>`, { callback: (_err, m) => grant(m) });
  const head = (task: string) => ({ task, partition: null, version: 0, seq: 0, type: null, owner: null, kind: null });
  nc.subscribe(`${prefix}.task.head`, {
    callback: (_err, m) => {
      const r = m.json<{ task?: string; tasks?: string[]; event_id?: string; lookups?: unknown[] }>();
      if (r.lookups) {
        batches++;
        const h = headers();
        h.set("Nats-Service-Error", 'bad request: unknown field "lookups"');
        h.set("Nats-Service-Error-Code", "400");
        m.respond(JSON.stringify({ error: "invalid", message: 'bad request: unknown field "lookups"' }), { headers: h });
      } else if (r.tasks) {
        m.respond(JSON.stringify({ heads: r.tasks.map(head) }));
      } else if (r.event_id) {
        singles++;
        m.respond(JSON.stringify({ ...head(r.task!), event: { event_id: r.event_id, verdict: "committed", reason: "", seq: 7 } }));
      } else {
        m.respond(JSON.stringify(head(r.task!)));
      }
    },
  });
  await nc.flush();
  return {
    counts: () => ({ batches, singles }),
    async close() {
      await nc.request(`$JS.API.STREAM.DELETE.${stream}`, "", { timeout: 5000 });
      await nc.close();
    },
  };
}

// Against a ledger older than the batch form of lookups, the first batch is
// refused as an unknown field, and the client asks for each event alone from
// then on, without trying a batch again: every event learns its verdict.
// The Go twin: TestWorkerFallsBackToSingleLookupsOnAnIngestWithoutBatches.
// Switch: unknownBatch (src/client.ts) returning false: a batch every round.
test("against a ledger without the batch form, lookups go one by one", { timeout: 30_000 }, async () => {
  const prefix = "oldledger";
  const fake = await fakeOldLedger(prefix);
  try {
    const c = await connect({ holder: "old.1", servers: ledger.natsUrl, prefix, partitions: 16, logger: quiet, receiptTimeoutMs: 300, batchMax: 1 });
    clients.push(c);
    const lease = await c.acquire(3, { signal: AbortSignal.timeout(5000) });
    const n = 50;
    const ps: Pending[] = [];
    for (let i = 0; i < n; i++) ps.push(await lease.publishJSON(`old-${i}`, "step", { i }));
    for (const p of ps) {
      const r = await p.wait({ signal: AbortSignal.timeout(20_000) });
      assert.equal(r.verdict, "committed");
      assert.equal(r.seq, 7);
    }
    const { batches, singles } = fake.counts();
    assert.equal(batches, 1, "the client tried a batch again after the ledger said it does not know the form");
    assert.ok(singles >= n, `${singles} single lookups for ${n} events`);
  } finally {
    await fake.close();
  }
});
