// Builds ledgerctl from this checkout for the tests, which run a real ledger
// with "ledgerctl dev". LEDGERCTL names a binary to use instead.
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import path from "node:path";

if (process.env.LEDGERCTL) process.exit(0);
const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../../..");
const out = path.resolve(here, "../build-test/ledgerctl");
const env = { ...process.env, PATH: `/usr/local/go/bin:${process.env.PATH}` };
try {
  execFileSync("go", ["build", "-o", out, "./cmd/ledgerctl"], { cwd: repo, env, stdio: "inherit" });
} catch (err) {
  console.error(`build-ledgerctl: go build ./cmd/ledgerctl failed (Go is needed for the tests): ${err.message}`);
  process.exit(1);
}
