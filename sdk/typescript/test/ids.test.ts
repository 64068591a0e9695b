import { test } from "node:test";
import assert from "node:assert/strict";

import { batchMessage, contentToken, ulid, validEventId } from "../src/index.js";

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

test("a batch message is the contract's, byte for byte as the Go codec makes it", () => {
  const enc = new TextEncoder();
  const ev = (id: string, task: string, version: number, type: string, payload: string, snapshot = false) => ({
    id: `01JD000000000000000000000${id}`,
    task,
    version,
    type,
    payload: enc.encode(payload),
    snapshot,
  });
  const m = batchMessage("ledger.in.reports.pod-a.3", 7, [
    ev("2", "report-7", 12, "running", '{"pct":10}'),
    ev("3", "report-8", 1, "start", ""),
    ev("4", "state-1", 2, "snap", '[1,"é"]', true),
  ]);
  // The vector of pkg/wire's BatchMsg for the same three events.
  assert.equal(
    new TextDecoder().decode(m.body),
    '[{"event_id":"01JD0000000000000000000002","task":"report-7","version":12,"type":"running","payload":{"pct":10}},' +
      '{"event_id":"01JD0000000000000000000003","task":"report-8","version":1,"type":"start","payload":null},' +
      '{"event_id":"01JD0000000000000000000004","task":"state-1","version":2,"type":"snap","payload":[1,"é"],"kind":"snapshot"}]',
  );
  assert.equal(m.msgId, "batch-01JD0000000000000000000002:47966bd1976ccfba84e7fb24074d9701");
  assert.equal(m.generation, "7");
  assert.equal(m.count, "3");
});
