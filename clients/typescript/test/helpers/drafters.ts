/** Drafters for the loop's tests: no model. */

import type { Drafter, Proposal } from "../../src/drafter.js";
import { target } from "./fake_verifier.js";

/** Drafts what the fake target would say for the first `good` drafts of a block, then a wrong token. */
export class OracleDrafter implements Drafter {
  tokens: number[] = [];
  readonly tokenizerFingerprint = "fp";
  readonly maxPositions = 4096;
  readonly vocabSize = 50;
  readonly eosTokenIds = [49];
  proposals = 0;

  constructor(readonly good = Infinity) {}

  fork(): OracleDrafter {
    return new OracleDrafter(this.good);
  }

  reset(ids: readonly number[]): void {
    this.tokens = [...ids];
  }

  append(ids: readonly number[]): void {
    this.tokens.push(...ids);
  }

  rollbackTo(n: number): void {
    this.tokens.length = n;
  }

  /** Each id as a word: text to stream. */
  decode(ids: readonly number[]): string {
    return ids.map((id) => `w${id} `).join("");
  }

  /** The shadow's look: what it would have drafted at each streamed token (the target's token: a perfect draft). */
  async observe(ids: readonly number[]): Promise<number[]> {
    const guesses = ids.map((_, i) => target([...this.tokens, ...ids.slice(0, i)]));
    this.tokens.push(...ids);
    return guesses;
  }

  async observeChances(ids: readonly number[]): Promise<number[]> {
    return (await this.observe(ids)).map((guess, i) => (guess === ids[i] ? 1 : 0));
  }

  propose(k: number): Proposal {
    this.proposals += 1;
    const drafts: number[] = [];
    for (let i = 0; i < k; i++) {
      const right = target(this.tokens);
      const token = i < this.good ? right : (right % 47) + 1; // (never equal to right)
      drafts.push(token);
      this.tokens.push(token);
    }
    return { tokens: drafts, q: null, draftMs: 0 };
  }
}

/** The fake target's greedy output after `prompt`: what every speculative run must produce. */
export function targetOutput(prompt: readonly number[], maxNewTokens: number, stop = 49): number[] {
  const context = [...prompt];
  const out: number[] = [];
  while (out.length < maxNewTokens) {
    const token = target(context);
    context.push(token);
    out.push(token);
    if (token === stop) break;
  }
  return out;
}
