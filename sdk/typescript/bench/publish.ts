// Publishes events as fast as the in-flight window allows and reports the
// committed rate and this process's CPU time per event.
//   node build-test/bench/publish.js <nats-url> [events] [tasks] [holder]
// BATCH_MAX sets the client's batchMax (1: every event alone; default the SDK's).
import { monitorEventLoopDelay } from "node:perf_hooks";

import { connect } from "../src/index.js";

const [url = "127.0.0.1:4222", eventsArg = "20000", tasksArg = "64", holder = "bench.ts-1"] = process.argv.slice(2);
const events = Number(eventsArg);
const tasks = Number(tasksArg);
const c = await connect({ holder, servers: url, maxInFlight: Number(process.env.MAX_IN_FLIGHT ?? 1024), ...(process.env.BATCH_MAX ? { batchMax: Number(process.env.BATCH_MAX) } : {}), logger: { warn: console.warn, info: () => {}, debug: () => {} } });
const byPartition = new Map<number, string[]>();
for (let i = 0; i < tasks; i++) {
  const t = `${holder.replace(".", "-")}-task-${i}`;
  const p = c.partitionOf(t);
  byPartition.set(p, [...(byPartition.get(p) ?? []), t]);
}
const leases = await Promise.all([...byPartition.keys()].map((p) => c.acquire(p)));
const lag = monitorEventLoopDelay({ resolution: 10 });
lag.enable();
const cpu0 = process.cpuUsage();
const t0 = performance.now();
const per = Math.ceil(events / leases.length);
const lost = Promise.race(leases.map((l) => l.lost)).then((e) => {
  console.log(JSON.stringify({ error: e.message, after_s: +((performance.now() - t0) / 1000).toFixed(2), loop_delay_max_ms: Math.round(lag.max / 1e6), loop_delay_p99_ms: Math.round(lag.percentile(99) / 1e6) }));
  process.exit(1);
});
void lost;
await Promise.all(
  leases.map(async (l) => {
    const ts = byPartition.get(l.partition)!;
    const waits = [];
    for (let i = 0; i < per; i++) {
      const p = await l.publish(ts[i % ts.length]!, "step", `{"i":${i}}`);
      waits.push(p.wait());
    }
    await Promise.all(waits);
  }),
);
const secs = (performance.now() - t0) / 1000;
const cpu = process.cpuUsage(cpu0);
const n = per * leases.length;
console.log(JSON.stringify({ events: n, leases: leases.length, seconds: +secs.toFixed(2), rate: Math.round(n / secs), cpu_us_per_event: +((cpu.user + cpu.system) / n).toFixed(1), loop_delay_max_ms: Math.round(lag.max / 1e6), loop_delay_p99_ms: Math.round(lag.percentile(99) / 1e6) }));
await Promise.all(leases.map((l) => l.release()));
await c.close();
