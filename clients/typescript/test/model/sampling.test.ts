import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  PositionDraws, SparseDist, coupledToken, mix64, pairwiseSum, positionKey, positionUniforms, probsFromLogits, roundDraws, sample,
  truncateTopN,
} from "../../src/model/index.js";
import { u64ToBigInt } from "../../src/model/sampling.js";
import { pythonReference } from "./reference.js";

interface SamplingReference {
  cases: {
    logits: number[]; temperature: number; top_k: number; top_p: number; top_n: number; probs: number[];
    q_ids: number[]; q_probs: number[]; seed: string; positions: number[]; draws: number[];
  }[];
  uniforms: { seed: string; position: number; key: string; u: number[] }[];
}

const hex = (x: bigint) => x.toString(16).padStart(16, "0");

describe("coupled draws: docs/protocol.md's table, bit for bit", () => {
  it("mix64, key and u for the documented seeds and positions", () => {
    assert.equal(hex(u64ToBigInt(mix64([0, 0]))), "e220a8397b1dcdaf");
    const table: [bigint, number, number, string, number][] = [
      [0n, 0, 0, "a706dd2f4d197e6f", 0.13870941014555427],
      [1n, 7, 2, "7716da39cba275b2", 0.412675225760361],
      [(1n << 64n) - 1n, 123456, 49151, "119c098bcefb8e27", 0.5509294761958828],
    ];
    for (const [seed, position, token, key, u] of table) {
      assert.equal(hex(u64ToBigInt(positionKey(seed, position))), key);
      assert.equal(positionUniforms(seed, position, [token])[0], u);
    }
  });
});

describe("sampling: equal to edge/sampling.py", async () => {
  const reference = await pythonReference<SamplingReference>("sampling");

  it("hashes the same uniforms (seeds up to 2^64 - 1)", () => {
    for (const row of reference.uniforms) {
      assert.equal(hex(u64ToBigInt(positionKey(BigInt(row.seed), row.position))), row.key);
      assert.deepEqual(Array.from(positionUniforms(BigInt(row.seed), row.position, [0, 2, 49151, 262143])), row.u);
    }
  });

  it("processes logits to the same distribution, cuts the same q and draws the same coupled tokens", () => {
    for (const [i, c] of reference.cases.entries()) {
      const params = { temperature: c.temperature, topK: c.top_k, topP: c.top_p, seed: 11n };
      const probs = probsFromLogits(Float32Array.from(c.logits), params);
      probs.forEach((p, v) => assert.ok(Math.abs(p - c.probs[v]) <= 1e-12 * Math.max(1e-300, c.probs[v]) + 1e-300, `case ${i} token ${v}`));
      const q = truncateTopN(probs, c.top_n);
      assert.deepEqual(Array.from(q.tokenIds), c.q_ids, `case ${i}`);
      q.probs.forEach((p, j) => assert.ok(Math.abs(p - c.q_probs[j]) <= 1e-12 * c.q_probs[j]));
      const draws = new PositionDraws(BigInt(c.seed));
      assert.deepEqual(c.positions.map((position) => sample(q, draws, position)), c.draws, `case ${i}`);
    }
  });

  it("the verifier's rule (coupledToken) samples p: frequencies over positions follow p", () => {
    const probs = Float64Array.of(0.5, 0.3, 0.2);
    const counts = [0, 0, 0];
    for (let position = 0; position < 6000; position++) counts[coupledToken(probs, 99n, position)]++;
    counts.forEach((count, v) => assert.ok(Math.abs(count / 6000 - probs[v]) < 0.03, `token ${v}: ${count}`));
  });
});

describe("sampling: the rest", () => {
  it("pairwise sums as numpy does (differs from a running sum)", () => {
    const values = Float64Array.from({ length: 1000 }, (_, i) => 1 / (i + 1) ** 1.5 + 1e-9 * i);
    let running = 0;
    values.forEach((v) => (running += v));
    assert.ok(Math.abs(pairwiseSum(values) - running) < 1e-12);
  });

  it("a round's draws repeat for the same (seed, round) and differ across rounds", () => {
    const a = roundDraws(5n, 3), b = roundDraws(5n, 3), c = roundDraws(5n, 4);
    const xs = [a.random(), a.random()];
    assert.deepEqual([b.random(), b.random()], xs);
    assert.notEqual(c.random(), xs[0]);
    xs.forEach((x) => assert.ok(x >= 0 && x < 1));
    const q = new SparseDist(Int32Array.of(4, 9), Float64Array.of(0.75, 0.25));
    const counts = new Map<number, number>();
    const draws = roundDraws(1n, 0);
    for (let i = 0; i < 4000; i++) {
      const token = sample(q, draws);
      counts.set(token, (counts.get(token) ?? 0) + 1);
    }
    assert.ok(Math.abs((counts.get(4) ?? 0) / 4000 - 0.75) < 0.03);
  });
});
