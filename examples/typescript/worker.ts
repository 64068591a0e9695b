// A primary/standby worker: run it twice with different instances; one holds
// the partition of its tasks, the other waits and takes over when the first
// releases (SIGTERM) or stops renewing (kill -9, a pause).
//
//   node dist/worker.js --servers 127.0.0.1:4222 --principal reports --instance a \
//     --tasks report-1 --steps 8 --every 500
import { parseArgs } from "node:util";
import { connect, LedgerError, type Lease } from "@flowness/ledger";

const { values: f } = parseArgs({
  options: {
    servers: { type: "string", default: "127.0.0.1:4222" },
    principal: { type: "string", default: "reports" },
    instance: { type: "string", default: `pid-${process.pid}` },
    tasks: { type: "string", default: "report-1" },
    steps: { type: "string", default: "8" },
    every: { type: "string", default: "500" },
    ttl: { type: "string", default: "3000" },
  },
});
const holder = `${f.principal}.${f.instance}`;
const tasks = f.tasks!.split(",");
const steps = Number(f.steps);
const every = Number(f.every);
const say = (msg: string) => console.log(`${(performance.now() / 1000).toFixed(3)} ${holder} ${msg}`);

const stop = new AbortController();
for (const sig of ["SIGTERM", "SIGINT"] as const) process.once(sig, () => stop.abort(new Error(sig)));

const client = await connect({ holder, servers: f.servers, ttlMs: Number(f.ttl) });
const partition = client.partitionOf(tasks[0]!);
if (tasks.some((t) => client.partitionOf(t) !== partition)) throw new Error("this example keeps its tasks on one partition");

async function work(lease: Lease): Promise<"done" | "stopped" | "lost"> {
  // Stop when the process is told to, or the lease ends.
  const signal = AbortSignal.any([stop.signal, lease.signal]);
  for (const task of tasks) {
    const head = await client.taskHead(task);
    if (head.type === "completed") continue; // done by an earlier holder
    say(`${task}: resuming after version ${head.version}`);
    for (let step = head.version + 1; step <= steps; step++) {
      if (signal.aborted) return lease.signal.aborted ? "lost" : "stopped";
      const type = step === steps ? "completed" : "running";
      const p = await lease.publishJSON(task, type, { step, of: steps, by: holder }, { signal });
      const r = await p.wait({ signal: AbortSignal.timeout(30_000) }); // our own signal, not the lease's
      say(`${task}: version ${r.version} ${r.verdict}`);
      await new Promise((r) => setTimeout(r, every));
    }
  }
  return "done";
}

for (;;) {
  say(`standby: waiting for partition ${partition}`);
  let lease: Lease;
  try {
    lease = await client.acquireWait(partition, { signal: stop.signal });
  } catch {
    break; // told to stop while standing by
  }
  say(`primary: holds partition ${partition} at generation ${lease.generation}`);
  let outcome: "done" | "stopped" | "lost";
  try {
    outcome = await work(lease);
  } catch (err) {
    if (!(err instanceof LedgerError)) throw err;
    outcome = lease.signal.aborted && lease.signal.reason.code === "LEASE_LOST" ? "lost" : "stopped";
    if (outcome === "stopped" && !stop.signal.aborted) throw err;
  }
  if (outcome === "lost") {
    say(`lost partition ${partition} (generation ${lease.generation}): ${(await lease.lost).message}`);
    continue;
  }
  await lease.release({ signal: AbortSignal.timeout(10_000) }).catch((err) => say(`release: ${err.message}`));
  say(outcome === "done" ? "all tasks completed; released" : "stopping; released");
  break;
}
await client.close();
