import { test } from "node:test";
import assert from "node:assert/strict";

import { ServiceError } from "../src/index.js";

// A principal over its share of the lease service is refused with busy or
// rate_limited: the SDK takes it as UNAVAILABLE, which every retry loop
// (acquire, acquireWait, renewals, verdict lookups) backs off on.
test("busy and rate_limited are retried like unavailable", () => {
  for (const error of ["busy", "rate_limited"]) {
    const err = new ServiceError({ error, message: "retry later" });
    assert.equal(err.code, "UNAVAILABLE");
    assert.equal(err.error, error);
  }
  assert.equal(new ServiceError({ error: "teapot", message: "" }).code, "INVALID");
});
