// A real ledger for a test file: "ledgerctl dev" with a fresh database of its
// own on the test server (TEST_DATABASE_URL, default the local PostgreSQL).
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import path from "node:path";

export interface DevLedger {
  natsUrl: string;
  partitions: number;
  stop(): Promise<void>;
}

const here = path.dirname(fileURLToPath(import.meta.url));

export async function startLedger(extra: string[] = []): Promise<DevLedger> {
  const bin = process.env.LEDGERCTL ?? path.resolve(here, "../ledgerctl");
  const db = process.env.TEST_DATABASE_URL ?? "postgres://root@127.0.0.1:5432/test?sslmode=disable";
  const child: ChildProcess = spawn(
    bin,
    ["dev", "-json", "-nats-port", "0", "-fresh-database", "-database-url", db, "-gap-window", "2s", "-stop-on-stdin-eof", ...extra],
    // stdin stays open while this process lives: if it dies, so does the ledger.
    { stdio: ["pipe", "pipe", "inherit"] },
  );
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const lines = createInterface({ input: child.stdout! });
  const first = await Promise.race([
    new Promise<string>((resolve) => lines.once("line", resolve)),
    exited.then((code) => Promise.reject(new Error(`ledgerctl dev exited with ${code} before it was ready`))),
    new Promise<never>((_, reject) => setTimeout(() => reject(new Error("ledgerctl dev not ready within 60 s")), 60_000).unref()),
  ]);
  const ready = JSON.parse(first) as { nats_url: string; partitions: number };
  return {
    natsUrl: ready.nats_url,
    partitions: ready.partitions,
    async stop() {
      child.kill("SIGTERM");
      await exited;
    },
  };
}
