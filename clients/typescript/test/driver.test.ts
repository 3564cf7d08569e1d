/** The generation loop against an in-process verifier: output, send-ahead, resume, drain, refusals, cancellation. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { EdgeClient } from "../src/client.js";
import { CancelledError, Code, InvalidRequestError, TokenizerMismatchError } from "../src/errors.js";
import { FakeVerifier, type Script } from "./helpers/fake_verifier.js";
import { OracleDrafter, targetOutput } from "./helpers/drafters.js";
import { MemoryTransport } from "./helpers/memory_transport.js";
import { Planner } from "../src/planner.js";
import { Shadow } from "../src/shadow.js";

const PROMPT = [3, 4, 5, 6];

async function client(script: Script = {}, good = Infinity) {
  const verifier = new FakeVerifier(script);
  const transport = new MemoryTransport(verifier, script);
  const c = await EdgeClient.connect("memory", { draft: new OracleDrafter(good), transport, timeoutS: 5, maxRetries: 2 });
  return { c, verifier, transport };
}

describe("the generation loop", () => {
  for (const [k, sendAhead, good] of [[4, 1, Infinity], [4, 3, Infinity], [3, 2, 1], [6, 4, 0], [1, 1, 2]] as const) {
    it(`commits the target's output: k=${k}, send-ahead ${sendAhead}, ${good} good drafts a block`, async () => {
      const { c } = await client({}, good);
      const result = await c.generate(PROMPT, { maxNewTokens: 23, k, sendAhead, speculate: true });
      assert.deepEqual(result.tokenIds, targetOutput(PROMPT, 23));
      assert.equal(result.finishReason, "length");
      if (good === Infinity) assert.ok(result.stats.meanAcceptanceLength > 2);
      if (sendAhead > 1 && good === Infinity) assert.ok(result.stats.aheadHits > 0, "blocks sent ahead were verified");
      if (sendAhead > 1 && good !== Infinity) assert.ok(result.stats.discardedBlocks > 0, "blocks sent ahead were discarded");
    });
  }

  it("resumes a broken stream from every committed token, the next round and the budget left", async () => {
    const { c, verifier } = await client({ cutAfter: 2 }, 1);
    const result = await c.generate(PROMPT, { maxNewTokens: 12, k: 3, sendAhead: 1, speculate: true });
    assert.deepEqual(result.tokenIds, targetOutput(PROMPT, 12));
    assert.equal(verifier.opens.length, 2);
    const [, reopen] = verifier.opens;
    assert.deepEqual(reopen!.promptIds, [...PROMPT, ...result.tokenIds.slice(0, 4)]);
    assert.equal(reopen!.firstRound, 2);
    assert.equal(reopen!.maxNewTokens, 8);
    assert.equal(result.stats.resumes, 1);
  });

  it("moves at once when a verdict says draining, through a fresh connection", async () => {
    const { c, transport } = await client({ cutAfter: 1, draining: true });
    const result = await c.generate(PROMPT, { maxNewTokens: 10, k: 2, sendAhead: 1, speculate: true });
    assert.deepEqual(result.tokenIds, targetOutput(PROMPT, 10));
    assert.equal(result.stats.moves, 1);
    assert.equal(result.stats.resumes, 0);
    assert.ok(transport.reconnects >= 1);
  });

  it("retries a full replica, and never retries a refusal that says not to", async () => {
    const full = await client({ refuse: Code.RESOURCE_EXHAUSTED });
    assert.deepEqual((await full.c.generate(PROMPT, { maxNewTokens: 5, k: 2, speculate: true })).tokenIds, targetOutput(PROMPT, 5));
    const wrong = await client({ refuse: Code.INVALID_ARGUMENT });
    await assert.rejects(wrong.c.generate(PROMPT, { maxNewTokens: 5, k: 2, speculate: true }), (error: unknown) => {
      assert.ok(error instanceof InvalidRequestError);
      assert.equal(error.partial?.finishReason, "error");
      return true;
    });
    assert.equal(wrong.verifier.opens.length, 1);
  });

  it("stops on an AbortSignal with CancelledError, keeping what was committed", async () => {
    const { c } = await client({}, 0);
    const controller = new AbortController();
    const stream = c.stream(PROMPT, { maxNewTokens: 200, k: 2, sendAhead: 1, speculate: true, signal: controller.signal });
    let chunks = 0;
    await assert.rejects((async () => {
      for await (const _ of stream) {
        chunks += 1;
        if (chunks === 3) controller.abort();
      }
    })(), CancelledError);
    assert.ok(stream.result!.tokenIds.length >= 3 && stream.result!.tokenIds.length < 200);
    assert.deepEqual(stream.result!.tokenIds, targetOutput(PROMPT, stream.result!.tokenIds.length));
  });

  it("ends the session when the caller stops iterating", async () => {
    const { c } = await client();
    const stream = c.stream(PROMPT, { maxNewTokens: 100, k: 2, sendAhead: 1, speculate: true });
    for await (const _ of stream) break;
    assert.equal(stream.result!.finishReason, "cancelled");
  });
});

describe("cloud-only and the shadow", () => {
  it("streams the target's output over Generate when told not to speculate", async () => {
    const { c, transport } = await client();
    const result = await c.generateCloud(PROMPT, { maxNewTokens: 11 });
    assert.deepEqual(result.tokenIds, targetOutput(PROMPT, 11));
    assert.equal(transport.generateCalls, 1);
    assert.deepEqual(result.segments, [["cloud_only", 11]]);
  });

  it("runs the draft over the streamed tokens and tells the planner each one's chance", async () => {
    const planner = new Planner("auto");
    const seen: number[][] = [];
    const observe = planner.observe.bind(planner);
    planner.observe = (event) => {
      if (event.kind === "shadowed") seen.push(event.chances);
      observe(event);
    };
    const drafter = new OracleDrafter();
    const committed = [...PROMPT];
    const shadow = new Shadow(drafter, planner, committed, { lookup: false, sampling: null, lookupWeight: 1, topN: 0, coupledSeed: null }, () => 0);
    const streamed = targetOutput(PROMPT, 20);
    for (let i = 0; i < 20; i += 4) {
      committed.push(...streamed.slice(i, i + 4));
      shadow.observe(streamed.slice(i, i + 4), committed, 4096, null);
    }
    await shadow.finish(committed);
    assert.deepEqual(seen.flat(), new Array(20).fill(1)); // a perfect draft: every token a hit
    assert.deepEqual(drafter.tokens, committed); // the draft kept up: speculation resumes without a prefill
    assert.ok(planner.state.acceptance.seen > 0);
  });
});

describe("EdgeClient", () => {
  it("renders chat messages with the draft's template and generates after them", async () => {
    const verifier = new FakeVerifier();
    const draft = Object.assign(new OracleDrafter(), {
      applyChatTemplate: (messages: Array<{ role: string; content: string }>) => messages.map((m) => m.content.length),
    });
    const c = await EdgeClient.connect("memory", { draft, transport: new MemoryTransport(verifier), timeoutS: 5 });
    const result = await c.chat([{ role: "user", content: "abc" }, { role: "assistant", content: "de" }], { maxNewTokens: 6, k: 3, speculate: true });
    assert.deepEqual(result.promptIds, [3, 2]);
    assert.deepEqual(verifier.opens[0]!.promptIds, [3, 2]);
    assert.deepEqual(result.tokenIds, targetOutput([3, 2], 6));
  });

  it("refuses a verifier whose tokenizer is not the draft's", async () => {
    const draft = Object.assign(new OracleDrafter(), { tokenizerFingerprint: "tok1-bpe-1-other" });
    const c = await EdgeClient.connect("memory", { draft, transport: new MemoryTransport(new FakeVerifier()), timeoutS: 5 });
    await assert.rejects(c.generate(PROMPT, { maxNewTokens: 3 }), TokenizerMismatchError);
  });
});
