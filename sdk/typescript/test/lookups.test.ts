import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect as natsConnect } from "@nats-io/transport-node";

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
