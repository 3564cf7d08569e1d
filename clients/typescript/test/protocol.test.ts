/** The sans-I/O core (protocol.ts) by hand: commits, the budget, send-ahead, stale and discarded blocks, resume. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { create } from "@bufbuild/protobuf";
import { VerdictSchema, FinishReason } from "../src/gen/edgespec/v1/speculative_pb.js";
import { generationParams } from "../src/params.js";
import { Block, ClientSession } from "../src/protocol.js";
import { StatusError } from "../src/errors.js";

const verdict = (fields: Record<string, unknown>) => create(VerdictSchema, fields);

function session(maxNewTokens = 10, maxContext = 100) {
  return new ClientSession([1, 2, 3], generationParams({ maxNewTokens, mode: "greedy" }), "fp", [9], maxContext, 8);
}

describe("ClientSession", () => {
  it("commits the accepted drafts and the next token, and counts rounds", () => {
    const s = session();
    s.draft(new Block(0, [5, 6, 7], null));
    const outcome = s.verdict(verdict({ round: 0, accepted: 2, nextToken: 8 }));
    assert.equal(outcome.kind, "committed");
    assert.deepEqual(outcome.tokens, [5, 6, 8]);
    assert.equal(outcome.keep, 5);
    assert.deepEqual(s.generated, [5, 6, 8]);
    assert.equal(s.roundNo, 1);
    assert.equal(s.remaining, 7);
  });

  it("opens with every committed token, the budget left and the next round", () => {
    const s = session();
    s.draft(new Block(0, [5], null));
    s.verdict(verdict({ round: 0, accepted: 1, nextToken: 6 }));
    const open = s.open();
    assert.equal(open.kind.case, "open");
    if (open.kind.case !== "open") return;
    assert.deepEqual(open.kind.value.promptIds, [1, 2, 3, 5, 6]);
    assert.equal(open.kind.value.maxNewTokens, 8);
    assert.equal(open.kind.value.firstRound, 1);
    assert.deepEqual(open.kind.value.stopTokenIds, [9]);
    assert.equal(s.inflight.length, 0);
  });

  it("keeps a block sent ahead only when the verdict before it is exactly what it assumed", () => {
    const s = session(50);
    s.draft(new Block(0, [5, 6], null));
    s.draft(new Block(1, [8, 9], null, 7));
    const held = s.verdict(verdict({ round: 0, accepted: 2, nextToken: 7 }));
    assert.equal(held.holds, true);
    assert.equal(held.dropped, 0);
    s.draft(new Block(2, [1], null, 3));
    const missed = s.verdict(verdict({ round: 1, accepted: 1, nextToken: 4 }));
    assert.equal(missed.holds, false);
    assert.equal(missed.dropped, 1);
    assert.equal(s.verdict(verdict({ round: 2, discarded: true })).kind, "stale");
  });

  it("resynchronises when the verifier discards a block the device counted on", () => {
    const s = session(50);
    s.draft(new Block(0, [5], null, 4));
    s.draft(new Block(1, [6], null, 2));
    const outcome = s.verdict(verdict({ round: 0, discarded: true }));
    assert.equal(outcome.kind, "discarded");
    assert.equal(outcome.dropped, 2);
    assert.equal(outcome.keep, 3);
  });

  it("reads the budget edge's cut verdict and its finish reason", () => {
    const s = session(3);
    s.draft(new Block(0, [5, 6, 7], null));
    const outcome = s.verdict(verdict({ round: 0, accepted: 2, nextToken: 6, finished: true, finishReason: FinishReason.LENGTH }));
    assert.deepEqual(s.generated, [5, 6, 6]);
    assert.equal(outcome.finished, true);
    assert.equal(s.finishReason, "length");
  });

  it("limits blocks by max_k, the context room and the budget", () => {
    const s = session(4, 10);
    assert.equal(s.freshLimit(), 3); // budget 4: at most 3 drafts + the token after them
    s.draft(new Block(0, [5, 6, 7], null));
    assert.equal(s.aheadLimit(), 0); // the budget is spent by the block in flight
    const roomy = session(100, 10);
    assert.equal(roomy.freshLimit(), 6); // 10 - 3 committed - 1
  });

  it("refuses a verdict for another round than the oldest block's", () => {
    const s = session();
    s.draft(new Block(0, [5], null));
    assert.throws(() => s.verdict(verdict({ round: 1, accepted: 0, nextToken: 2 })), StatusError);
  });

  it("commits a tree's accepted path", () => {
    const s = session();
    const block = new Block(0, [5, 6, 8], null, null, 0, false, [-1, 0, 0]);
    assert.equal(block.chainLength, 2);
    s.draft(block);
    const outcome = s.verdict(verdict({ round: 0, accepted: 2, nextToken: 4, acceptedPath: [0, 2] }));
    assert.deepEqual(outcome.tokens, [5, 8, 4]);
    assert.equal(outcome.keep, 4); // the chain's accepted part only
  });
});
