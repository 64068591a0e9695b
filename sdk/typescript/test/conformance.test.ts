// The contract's conformance cases (conformance/cases/*.json), run with
// nats.js against a real ledger: the same files the Go runner runs
// (internal/conformance), judged by the same rules (its package doc).
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { connect as natsConnect, headers as natsHeaders, type NatsConnection } from "@nats-io/transport-node";

import { ulid } from "../src/index.js";
import { startLedger, type DevLedger } from "./ledger.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const casesDir = path.resolve(here, "../../../../conformance/cases");
const GAP_WINDOW_MS = 2000;

interface Step {
  step: "request" | "publish" | "receipt" | "projection" | "sleep";
  note?: string;
  subject?: string;
  headers?: Record<string, string>;
  body?: unknown;
  event_id?: string;
  task?: string;
  ms?: number;
  expect?: { headers?: Record<string, string>; body?: unknown; ack?: unknown; receipt?: unknown; value?: unknown };
}

/** withIDs replaces each ${id_NAME} with a fresh ULID, one per NAME. */
function withIDs(text: string): string {
  const ids = new Map<string, string>();
  return text.replace(/\$\{id_[A-Za-z0-9_]+\}/g, (ref) => {
    if (!ids.has(ref)) ids.set(ref, ulid());
    return ids.get(ref)!;
  });
}

/** match says where got differs from want ("" when it matches): the rules of internal/conformance. */
export function match(where: string, want: unknown, got: unknown): string {
  if (typeof want === "string") {
    if (want === "$any") return got === undefined || got === null ? `${where}: missing` : "";
    if (want === "$absent") return got === undefined || got === null || got === false ? "" : `${where}: want absent, got ${JSON.stringify(got)}`;
    if (want === "$positive") return typeof got === "number" && got > 0 ? "" : `${where}: want a positive number, got ${JSON.stringify(got)}`;
    if (want === "$inbox") return typeof got === "string" && /^LEDGER_IN(_[A-Za-z0-9_-]{1,64})?$/.test(got) ? "" : `${where}: want LEDGER_IN or LEDGER_IN_<principal>, got ${JSON.stringify(got)}`;
    if (want.startsWith("$contains:")) {
      const text = want.slice("$contains:".length);
      return typeof got === "string" && got.includes(text) ? "" : `${where}: want a string containing ${JSON.stringify(text)}, got ${JSON.stringify(got)}`;
    }
    return got === want ? "" : `${where}: want ${JSON.stringify(want)}, got ${JSON.stringify(got)}`;
  }
  if (Array.isArray(want)) {
    if (!Array.isArray(got) || got.length !== want.length) return `${where}: want an array of ${want.length}, got ${JSON.stringify(got)}`;
    for (let i = 0; i < want.length; i++) {
      const d = match(`${where}[${i}]`, want[i], got[i]);
      if (d) return d;
    }
    return "";
  }
  if (want !== null && typeof want === "object") {
    if (got === null || typeof got !== "object" || Array.isArray(got)) return `${where}: want an object, got ${JSON.stringify(got)}`;
    for (const k of Object.keys(want).sort()) {
      const d = match(`${where}.${k}`, (want as Record<string, unknown>)[k], (got as Record<string, unknown>)[k]);
      if (d) return d;
    }
    return "";
  }
  if (want === null) return got === null || got === undefined ? "" : `${where}: want null, got ${JSON.stringify(got)}`;
  return got === want ? "" : `${where}: want ${JSON.stringify(want)}, got ${JSON.stringify(got)}`;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function runCase(nc: NatsConnection, name: string, steps: Step[]): Promise<void> {
  // Every receipt by event id, in arrival order.
  const receipts = new Map<string, unknown[]>();
  nc.subscribe("ledger.receipt.>", {
    callback: (err, m) => {
      if (err) return;
      // A batched receipt (contract §3) is an array of receipts.
      const body = m.json<{ event_id: string } | { event_id: string }[]>();
      for (const r of Array.isArray(body) ? body : [body]) {
        receipts.set(r.event_id, [...(receipts.get(r.event_id) ?? []), r]);
      }
    },
  });
  await nc.flush();
  // awaitReceipt waits for the n-th receipt of event id (from 0).
  const awaitReceipt = async (where: string, id: string, n: number, want: unknown) => {
    const until = performance.now() + GAP_WINDOW_MS + 8000;
    while ((receipts.get(id)?.length ?? 0) <= n) {
      if (performance.now() > until) assert.fail(`${where}: no receipt of event ${id}`);
      await sleep(5);
    }
    const got = receipts.get(id)![n];
    const d = match("receipt", want, got);
    assert.equal(d, "", `${where}: ${d}\nreceipt: ${JSON.stringify(got)}`);
  };
  for (const [i, s] of steps.entries()) {
    const where = `${name} step ${i + 1} (${s.step} ${s.subject ?? ""} ${s.note ?? ""})`;
    switch (s.step) {
      case "request": {
        const m = await nc.request(s.subject!, JSON.stringify(s.body), { timeout: 5000 });
        for (const [k, v] of Object.entries(s.expect?.headers ?? {})) assert.equal(m.headers?.get(k), v, `${where}: header ${k}`);
        if (s.expect?.body !== undefined) {
          const d = match("body", s.expect.body, m.json());
          assert.equal(d, "", `${where}: ${d}\nbody: ${m.string()}`);
        }
        break;
      }
      case "publish": {
        const h = natsHeaders();
        for (const [k, v] of Object.entries(s.headers ?? {})) h.set(k, v);
        // The event id is the Nats-Msg-Id up to its first ":".
        const id = s.headers!["Nats-Msg-Id"]!.split(":")[0]!;
        const before = receipts.get(id)?.length ?? 0;
        const ack = await nc.request(s.subject!, typeof s.body === "string" ? s.body : "", { headers: h, timeout: 5000 });
        if (s.expect?.ack !== undefined) {
          const d = match("ack", s.expect.ack, ack.json());
          assert.equal(d, "", `${where}: ${d}\nack: ${ack.string()}`);
        }
        if (s.expect?.receipt !== undefined) await awaitReceipt(where, id, before, s.expect.receipt);
        break;
      }
      case "receipt":
        await awaitReceipt(where, s.event_id!, 0, s.expect?.receipt);
        break;
      case "projection": {
        const until = performance.now() + 10_000;
        for (;;) {
          const m = await nc.request(`$JS.API.DIRECT.GET.KV_ledger_tasks.$KV.ledger_tasks.${s.task}`, undefined, { timeout: 5000 });
          const d = m.headers?.code === 404 ? "no value" : match("value", s.expect?.value, m.json());
          if (!d) break;
          if (performance.now() > until) assert.fail(`${where}: projection of ${s.task}: ${d}`);
          await sleep(20);
        }
        break;
      }
      case "sleep":
        await sleep(s.ms ?? 0);
        break;
      default:
        assert.fail(`${where}: unknown step`);
    }
  }
}

const files = readdirSync(casesDir)
  .filter((f) => f.endsWith(".json"))
  .sort();
assert.ok(files.length > 0, `no cases in ${casesDir}`);

let running: DevLedger | undefined;
after(async () => {
  await running?.stop();
});

for (const f of files) {
  const c = JSON.parse(withIDs(readFileSync(path.join(casesDir, f), "utf8"))) as { name: string; steps: Step[] };
  test(`conformance: ${c.name}`, { timeout: 60_000 }, async () => {
    running = await startLedger();
    const nc = await natsConnect({ servers: running.natsUrl });
    try {
      await runCase(nc, c.name, c.steps);
    } finally {
      await nc.close();
      await running.stop();
      running = undefined;
    }
  });
}
