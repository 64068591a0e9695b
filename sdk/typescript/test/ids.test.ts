import { test } from "node:test";
import assert from "node:assert/strict";

import { contentToken, ulid, validEventId } from "../src/index.js";

test("an event id has one spelling: a ULID in upper case", () => {
  assert.ok(validEventId("01JD0000000000000000000001"));
  assert.ok(validEventId(ulid()));
  for (const bad of ["", "01jd0000000000000000000001", "01JD000000000000000000000a", "01JD000000000000000000000U", "81JD0000000000000000000001", "01JD000000000000000000001"]) {
    assert.ok(!validEventId(bad), bad);
  }
});

test("the content token is the contract's digest, as the Go codec makes it", () => {
  const body = new TextEncoder().encode('{"status":"running"}');
  // The vector of pkg/wire's TestContentTokenIsTheContractsDigest (sha256sum's).
  assert.equal(contentToken("ledger.in.reports.pod-a.3.report-7", "1", "1", "running", body), "7638f151d18a50cb6346906d9aecdee2");
  assert.notEqual(
    contentToken("ledger.in.reports.pod-a.3.report-7", "1", "2", "running", body),
    contentToken("ledger.in.reports.pod-a.3.report-7", "1", "1", "running", body),
  );
});
