/**
 * The draft run over a cloud-only stream (edge/shadow.py): what it would have proposed at each
 * streamed token tells the planner what speculation would commit here (a `shadowed` event: per
 * token, the chance a draft there would have been accepted: greedy, a hit; sampled,
 * `observeChances`), and its time is its own cost. Tokens are run over SHADOW_BATCH at a time,
 * one forward each; a start on the cloud-only path has the draft read the prompt first. Between
 * looks (`Planner.shadowWanted`) it rests: the tokens it skips are kept, and the next look catches
 * the draft up on them in the same forward. Looks run one after another (a promise chain), beside
 * the stream's reads.
 */

import type { Drafter } from "./drafter.js";
import { lookupConfig, PositionDraws } from "./model/index.js";
import type { SamplingParams } from "./params.js";
import type { Planner } from "./planner.js";

export const SHADOW_BATCH = 8; // streamed tokens the draft is run over at once

export interface ShadowSettings {
  lookup: boolean;
  /** null: greedy. */
  sampling: SamplingParams | null;
  lookupWeight: number;
  topN: number;
  /** Coupled mode: hits are exact (the device knows the position's draws). */
  coupledSeed: bigint | null;
}

function samePrefix(tokens: readonly number[], committed: readonly number[]): boolean {
  return tokens.length >= committed.length && committed.every((t, i) => tokens[i] === t);
}

export class Shadow {
  private position = 0;
  private gap = false;
  private pending: Promise<void> = Promise.resolve();
  private buffer: number[] = [];
  private bufferProbs: Array<number | null> = [];
  private skipped: number[] = [];
  private inStep: boolean;
  private fresh: boolean;

  constructor(private readonly drafter: Drafter, private readonly planner: Planner, committed: readonly number[],
              private readonly settings: ShadowSettings, private readonly clock: () => number) {
    this.inStep = samePrefix(drafter.tokens, committed);
    this.fresh = !this.inStep;
    if (this.inStep) drafter.rollbackTo(committed.length);
  }

  /** Whether this drafter can shadow at all (the ONNX draft and the lookup drafter can). */
  static supported(drafter: Drafter): boolean {
    return typeof drafter.observe === "function" && typeof drafter.observeChances === "function";
  }

  /** `tokens` were just streamed and committed (`committed` ends with them); `probs`: their p(t), where sent. */
  observe(tokens: readonly number[], committed: readonly number[], maxContext: number, probs: number[] | null): void {
    if (!this.inStep && !this.fresh) return;
    const before = committed.slice(0, committed.length - tokens.length);
    if (committed.length + 1 >= maxContext) {
      this.flush(before);
      this.inStep = this.fresh = false; // the draft falls behind; the next speculative segment resets it
      return;
    }
    this.position += tokens.length;
    if (!this.planner.shadowWanted(this.position - 1)) {
      this.flush(before); // (the look so far counts)
      if (!this.fresh) this.skipped.push(...tokens);
      this.gap = true;
      return;
    }
    this.buffer.push(...tokens);
    this.bufferProbs.push(...(probs ?? tokens.map(() => null)));
    if (this.buffer.length >= SHADOW_BATCH) this.flush(committed);
  }

  private flush(committed: readonly number[]): void {
    const tokens = this.buffer;
    const probs = this.bufferProbs;
    this.buffer = [];
    this.bufferProbs = [];
    if (tokens.length === 0) return;
    let context: number[] | null = null;
    let skipped = this.skipped;
    if (this.fresh) {
      context = committed.slice(0, committed.length - tokens.length); // everything before these tokens, in one forward
      skipped = [];
    }
    this.skipped = [];
    this.fresh = false;
    this.inStep = true;
    const afterGap = this.gap;
    this.gap = false;
    this.pending = this.pending.then(async () => {
      if (!this.inStep) return;
      try {
        const started = this.clock();
        const seen = await this.look(context, skipped, tokens, probs);
        const ms = (this.clock() - started) * 1000;
        const chances = this.settings.sampling === null ? seen.map((guess, i) => (guess === tokens[i] ? 1 : 0)) : seen;
        // (a look that also read context is a one-off, not the shadow's cost per token)
        this.planner.observe({ kind: "shadowed", chances, draftMs: context !== null || skipped.length ? null : ms, afterGap });
      } catch {
        this.inStep = this.fresh = false;
      }
    });
  }

  private async look(context: number[] | null, skipped: number[], tokens: number[], probs: Array<number | null>): Promise<number[]> {
    const drafter = this.drafter;
    if (context !== null) drafter.reset(context);
    else if (skipped.length) drafter.append(skipped);
    const lookup = this.settings.lookup ? lookupConfig() : undefined;
    if (this.settings.sampling === null) return drafter.observe!(tokens, lookup);
    const s = this.settings;
    return drafter.observeChances!(tokens, {
      sampling: s.sampling!, lookup, lookupWeight: s.lookupWeight, topN: s.topN, targetProbs: probs,
      draws: s.coupledSeed === null ? undefined : new PositionDraws(s.coupledSeed),
    });
  }

  /** Waits for the last look, and leaves the draft's context at `committed` where it followed the stream. */
  async finish(committed: readonly number[]): Promise<void> {
    if (this.inStep || this.fresh) this.flush(committed);
    await this.pending;
    if (this.inStep && this.skipped.length) {
      this.drafter.append(this.skipped);
      this.skipped = [];
    }
  }
}
