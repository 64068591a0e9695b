import { createHash, randomFillSync } from "node:crypto";

const CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const CROCKFORD_CODES = Uint8Array.from(CROCKFORD, (c) => c.charCodeAt(0));
const pool = new Uint8Array(10 * 256);
let used = pool.length;
// An id is written here and read out as one flat string: built a character
// at a time it was 26 string concatenations, flattened again when hashed.
const chars = Buffer.alloc(26);

/**
 * ulid returns a new ULID: 48 bits of milliseconds and 80 bits from the
 * operating system's CSPRNG, 26 characters of Crockford base32. An event id is
 * the ledger's idempotency key across every worker, so it never comes from a
 * seeded generator two processes could share.
 */
export function ulid(now: number = Date.now()): string {
  if (used === pool.length) {
    randomFillSync(pool);
    used = 0;
  }
  let t = now;
  for (let i = 9; i >= 0; i--) {
    chars[i] = CROCKFORD_CODES[t % 32]!;
    t = Math.floor(t / 32);
  }
  // 80 random bits are 16 characters of 5 bits: 40 bits (5 bytes, 8
  // characters) at a time fit a double exactly.
  for (let at = 10; at < 26; at += 8) {
    let v = 0;
    for (let i = 0; i < 5; i++) v = v * 256 + pool[used++]!;
    for (let i = 7; i >= 0; i--) {
      chars[at + i] = CROCKFORD_CODES[v % 32]!;
      v = Math.floor(v / 32);
    }
  }
  return chars.toString("latin1", 0, 26);
}

/** ulidTime is the millisecond time a ULID carries. */
export function ulidTime(id: string): number {
  let t = 0;
  for (let i = 0; i < 10; i++) t = t * 32 + CROCKFORD.indexOf(id[i]!);
  return t;
}

/**
 * validEventId says whether s is an event id in its one spelling: 26
 * characters of Crockford base32 in upper case, the first at most "7". The
 * ledger refuses a lower-case ULID (invalid/bad_event_id) rather than store
 * one ULID under two spellings.
 */
export function validEventId(s: string): boolean {
  if (s.length !== 26 || s[0]! > "7") return false;
  for (const c of s) if (!CROCKFORD.includes(c)) return false;
  return true;
}

/**
 * contentToken is the token after the event id in an event's Nats-Msg-Id
 * (docs/contract.md §2): the first 16 bytes, in lower-case hex, of the SHA-256
 * of the subject, generation, version and type, each followed by a newline,
 * and the body. LEDGER_IN then drops only an identical re-send, and a copy
 * with other content under the same id reaches the ledger for its verdict.
 */
export function contentToken(subject: string, generation: string, version: string, type: string, body: Uint8Array): string {
  const h = createHash("sha256");
  for (const s of [subject, generation, version, type]) h.update(s + "\n");
  h.update(body);
  return h.digest("hex").slice(0, 32);
}
