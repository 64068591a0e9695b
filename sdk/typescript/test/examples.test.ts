// The TypeScript examples (examples/typescript) as a user runs them: a
// primary and its standby, SIGTERM to the primary mid-task, and a reader.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, symlinkSync, rmSync } from "node:fs";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { startLedger, type DevLedger } from "./ledger.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const sdk = path.resolve(here, "../..");
const examples = path.resolve(sdk, "../../examples/typescript");
const goStandby = path.resolve(sdk, "build-test/standby");

// Enough steps (100 ms each) that the primary is still at work when the standby is up.
const STEPS = 40;

let ledger: DevLedger;
const procs: ChildProcess[] = [];

before(() => {
  // The examples import @flowness/ledger as a user's program does: link this checkout.
  const link = path.join(examples, "node_modules/@flowness/ledger");
  mkdirSync(path.dirname(link), { recursive: true });
  rmSync(link, { force: true, recursive: true });
  symlinkSync(sdk, link, "dir");
  execFileSync(path.join(sdk, "node_modules/.bin/tsc"), ["-p", path.join(examples, "tsconfig.json")], { stdio: "inherit" });
  // The Go SDK's primary/standby example, to take over from a TypeScript worker.
  execFileSync("go", ["build", "-o", goStandby, "./examples/standby"], {
    cwd: path.resolve(sdk, "../.."),
    env: { ...process.env, PATH: `/usr/local/go/bin:${process.env.PATH}` },
    stdio: "inherit",
  });
});
after(async () => {
  for (const p of procs) p.kill("SIGKILL");
  await ledger?.stop();
});

/** run starts an example and collects its lines; wait(re) resolves with the first line matching re. */
function run(name: string, args: string[], bin?: string) {
  const argv = bin ? [bin, args] : [process.execPath, [path.join(examples, "dist", name), ...args]];
  const p = spawn(argv[0] as string, argv[1] as string[], { stdio: ["ignore", "pipe", "inherit"] });
  procs.push(p);
  const lines: string[] = [];
  const waiters: { re: RegExp; resolve: (l: string) => void }[] = [];
  createInterface({ input: p.stdout! }).on("line", (l) => {
    lines.push(l);
    for (const w of waiters.splice(0)) {
      if (w.re.test(l)) w.resolve(l);
      else waiters.push(w);
    }
  });
  const exited = new Promise<number | null>((r) => p.once("exit", (code) => r(code)));
  return {
    p,
    lines,
    exited,
    wait(re: RegExp): Promise<string> {
      const found = lines.find((l) => re.test(l));
      if (found) return Promise.resolve(found);
      return Promise.race([
        new Promise<string>((resolve) => waiters.push({ re, resolve })),
        exited.then((code) => Promise.reject(new Error(`${name} exited (${code}) before printing ${re}:\n${lines.join("\n")}`))),
      ]);
    },
  };
}

test("a standby takes over the task when its primary gets SIGTERM, and the reader sees it done", { timeout: 60_000 }, async () => {
  ledger = await startLedger();
  const common = ["--servers", ledger.natsUrl, "--tasks", "report-ex", "--steps", String(STEPS), "--every", "100", "--ttl", "1000"];
  const reader = run("reader.js", ["--servers", ledger.natsUrl, "--tasks", "report-ex", "--until", "completed"]);
  const a = run("worker.js", [...common, "--instance", "a"]);
  await a.wait(/version 3 committed/);
  const b = run("worker.js", [...common, "--instance", "b"]);
  await b.wait(/standby: waiting/);
  a.p.kill("SIGTERM");
  assert.equal(await a.exited, 0, "the primary releases and exits cleanly");
  assert.match(a.lines.at(-1)!, /stopping; released/);
  await b.wait(/primary: holds partition \d+ at generation 2/);
  assert.equal(await b.exited, 0);
  assert.match(b.lines.at(-1)!, /all tasks completed; released/);
  const resumed = Number(/resuming after version (\d+)/.exec(b.lines.join("\n"))![1]);
  const committed = [...a.lines, ...b.lines].flatMap((l) => /version (\d+) committed/.exec(l)?.[1] ?? []).map(Number);
  assert.deepEqual(committed, Array.from({ length: STEPS }, (_, i) => i + 1), `versions dense and in order: ${committed}`);
  assert.ok(resumed >= 3, "b resumed after a's last version");
  assert.equal(await reader.exited, 0);
  assert.match(reader.lines.at(-1)!, new RegExp(`^report-ex version ${STEPS} completed .*"step":${STEPS}`));
});

test("a Go standby takes over a task a TypeScript worker wrote, on the same partition", { timeout: 60_000 }, async () => {
  await ledger?.stop();
  ledger = await startLedger();
  const ts = run("worker.js", ["--servers", ledger.natsUrl, "--tasks", "report-x", "--steps", String(STEPS), "--every", "100", "--ttl", "1000", "--instance", "ts"]);
  await ts.wait(/version 3 committed/);
  // The Go example ends a task with "completed" after -steps running events: version STEPS too.
  const go = run("standby", ["-nats-url", ledger.natsUrl, "-principal", "reports", "-instance", "go", "-tasks", "report-x",
    "-steps", String(STEPS - 1), "-every", "100ms", "-ttl", "1s"], goStandby);
  await go.wait(/standby/);
  ts.p.kill("SIGTERM");
  assert.equal(await ts.exited, 0);
  const took = await go.wait(/primary: holds partition \d+ at generation 2/);
  const partition = Number(/partition (\d+)/.exec(took)![1]);
  assert.ok(ts.lines.some((l) => l.includes(`holds partition ${partition} at generation 1`)), "both SDKs put the task on one partition");
  await go.wait(new RegExp(`report-x: version ${STEPS} committed`));
  go.p.kill("SIGTERM");
  await go.exited;
  const resumed = Number(/resuming after version (\d+)/.exec(go.lines.join("\n"))![1]);
  const last = Math.max(...ts.lines.flatMap((l) => /version (\d+) committed/.exec(l)?.[1] ?? []).map(Number));
  assert.equal(resumed, last, "the Go standby resumes after the TypeScript worker's last version");
  const committed = [...ts.lines, ...go.lines].flatMap((l) => /version (\d+) committed/.exec(l)?.[1] ?? []).map(Number);
  assert.deepEqual(committed, Array.from({ length: STEPS }, (_, i) => i + 1), `versions dense and in order: ${committed}`);
});
