/** Parameters are validated once, with errors that name the field; defaults as the Python SDK's. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { generationParams, servedMode } from "../src/params.js";

describe("generationParams", () => {
  it("defaults: greedy at temperature 0, coupled when sampling, a fresh 63-bit seed", () => {
    const greedy = generationParams();
    assert.equal(greedy.mode, "greedy");
    assert.equal(greedy.seed, 0n);
    assert.equal(greedy.k, "auto");
    const sampled = generationParams({ temperature: 0.8 });
    assert.equal(sampled.mode, "coupled");
    assert.ok(sampled.seed >= 0n && sampled.seed < 1n << 63n);
    assert.notEqual(generationParams({ temperature: 0.8 }).seed, sampled.seed);
    assert.equal(generationParams({ temperature: 0.8, seed: 2n ** 64n - 1n }).seed, 2n ** 64n - 1n);
  });

  it("refuses bad values, naming the field", () => {
    assert.throws(() => generationParams({ temperature: -1 }), /temperature/);
    assert.throws(() => generationParams({ temperature: NaN }), /temperature/);
    assert.throws(() => generationParams({ topP: 0 }), /topP/);
    assert.throws(() => generationParams({ k: 0 }), /k must be/);
    assert.throws(() => generationParams({ mode: "exact" }), /samples/);
    assert.throws(() => generationParams({ sendAhead: 9 }), /sendAhead/);
    assert.throws(() => generationParams({ tree: 2, temperature: 1 }), /tree|greedily/);
    assert.throws(() => generationParams({ seed: 2 ** 64 }), /seed/);
    assert.throws(() => generationParams({ maxNewTokens: 0 }), /maxNewTokens/);
  });

  it("falls back from coupled to exact on a server that serves only exact", () => {
    const params = generationParams({ temperature: 1 });
    assert.equal(servedMode(params, ["greedy", "exact"]).mode, "exact");
    assert.equal(servedMode(params, ["greedy", "coupled"]).mode, "coupled");
  });
});
