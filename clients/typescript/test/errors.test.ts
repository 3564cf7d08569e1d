/** One typed error per status, whichever transport carried it; the retry decision. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  AuthenticationError, CapacityError, Code, ConnectionFailedError, DRAINING_MESSAGE, InternalServerError, InvalidRequestError,
  ReplyTimeout, RequestTimeoutError, SessionStateError, StatusError, statusFromClose, typedError,
} from "../src/errors.js";
import { ReplicaMoved, Retries } from "../src/retries.js";

describe("errors", () => {
  it("maps every status to the class edge/errors.py gives it", () => {
    const cases: Array<[Code, unknown]> = [
      [Code.INVALID_ARGUMENT, InvalidRequestError], [Code.OUT_OF_RANGE, InvalidRequestError],
      [Code.FAILED_PRECONDITION, SessionStateError], [Code.RESOURCE_EXHAUSTED, CapacityError],
      [Code.UNAUTHENTICATED, AuthenticationError], [Code.PERMISSION_DENIED, AuthenticationError],
      [Code.INTERNAL, InternalServerError], [Code.UNAVAILABLE, ConnectionFailedError], [Code.DEADLINE_EXCEEDED, RequestTimeoutError],
    ];
    for (const [code, Class] of cases) assert.ok(typedError(new StatusError(code, "x")) instanceof (Class as new () => Error), Code[code]);
    assert.ok(typedError(new ReplyTimeout(3)) instanceof RequestTimeoutError);
  });

  it("reads a WebSocket close 4000 + c as status c, 1000 as a normal end, others as a broken link", () => {
    assert.deepEqual([statusFromClose(4008, "full")?.code, statusFromClose(4008, "full")?.details], [Code.RESOURCE_EXHAUSTED, "full"]);
    assert.equal(statusFromClose(4016, "")?.code, Code.UNAUTHENTICATED);
    assert.equal(statusFromClose(1000, ""), null);
    assert.equal(statusFromClose(1006, "")?.code, Code.UNAVAILABLE);
    assert.ok(typedError(statusFromClose(4007, "origin")) instanceof AuthenticationError);
  });
});

describe("Retries", () => {
  it("retries what may pass, up to max retries, and raises the typed error then", () => {
    const retries = new Retries(2);
    assert.equal(retries.decide(new StatusError(Code.UNAVAILABLE, "x")).cause, "failure");
    assert.equal(retries.decide(new StatusError(Code.RESOURCE_EXHAUSTED, "x")).reroute, true);
    assert.throws(() => retries.decide(new StatusError(Code.UNAVAILABLE, "x")), ConnectionFailedError);
  });

  it("never retries a refusal that says not to", () => {
    assert.throws(() => new Retries(5).decide(new StatusError(Code.PERMISSION_DENIED, "x")), AuthenticationError);
  });

  it("moves at once after a drain, and waits out a draining replica without counting failures", () => {
    const retries = new Retries(0);
    assert.deepEqual(retries.decide(new ReplicaMoved()), { delayS: 0, reroute: true, cause: "moved" });
    const refusal = retries.decide(new StatusError(Code.UNAVAILABLE, DRAINING_MESSAGE));
    assert.equal(refusal.cause, "draining");
    assert.ok(refusal.delayS <= 0.1);
    assert.equal(retries.failures, 0);
    const cut = new TextDecoder().decode(new TextEncoder().encode(DRAINING_MESSAGE).slice(0, 123)); // a close reason's room
    assert.equal(retries.decide(statusFromClose(4014, cut)).cause, "draining");
    assert.throws(() => retries.decide(new StatusError(Code.UNAVAILABLE, "this replica")), ConnectionFailedError);
  });
});
