/**
 * Drafting blocks for the loop (edge/drafting.py): a fresh block (after the last verdict) or one
 * sent ahead (after a guessed bonus token), with the round's draws, timed by the run's clock.
 */

import type { Drafter, DrawsSpec, ProposeOptions } from "./drafter.js";
import { type GenerationParams, draftSampling } from "./params.js";
import { Block } from "./protocol.js";
import type { ShadowSettings } from "./shadow.js";

/** What the draft samples q from: p's parameters at the draft's own temperature (null: greedy). */
export function proposeOptions(params: GenerationParams): Omit<ProposeOptions, "draws" | "alternatives"> {
  const greedy = params.mode === "greedy";
  return {
    sampling: greedy ? null : draftSampling(params),
    topN: params.mode === "exact" || params.mode === "coupled" ? params.topN : 0,
    lookup: params.lookup !== false,
    lookupWeight: params.lookupWeight,
  };
}

/**
 * Turns a chain into a tree: the runner-up of each of the `count` least sure drafts joins as a
 * leaf, a sibling of that draft (parent: the draft before it, -1 for the first).
 */
export function addLeaves(block: Block, alternatives: Array<[number, number]>, count: number): void {
  const chain = block.tokens.length;
  const leastSure = [...Array(chain).keys()].sort((a, b) => alternatives[a]![1] - alternatives[b]![1]).slice(0, count);
  block.parents = [...Array(chain).keys()].map((i) => i - 1);
  for (const i of leastSure.sort((a, b) => a - b)) {
    block.tokens.push(alternatives[i]![0]);
    block.parents.push(i - 1);
  }
}

export class BlockDrafter {
  private readonly options: Omit<ProposeOptions, "draws" | "alternatives">;
  private readonly seed: bigint;
  private readonly coupled: boolean;

  constructor(readonly drafter: Drafter, params: GenerationParams, private readonly clock: () => number) {
    this.options = proposeOptions(params);
    this.seed = params.seed;
    this.coupled = params.mode === "coupled";
  }

  private draws(round: number, guess: boolean): DrawsSpec | null {
    if (this.options.sampling === null) return null;
    return { seed: this.seed, round, coupled: this.coupled, guess: guess && !this.coupled };
  }

  private async timed(k: number, draws: DrawsSpec | null, alternatives: boolean) {
    const started = this.clock();
    const proposal = await this.drafter.propose(k, { ...this.options, draws, alternatives });
    return { proposal, ms: (this.clock() - started) * 1000 };
  }

  /** k drafts after the committed tokens, and `leaves` runner-up leaves (a tree). */
  async fresh(round: number, k: number, leaves = 0, prefilled = false): Promise<Block> {
    const { proposal, ms } = await this.timed(k, this.draws(round, false), leaves > 0);
    const block = new Block(round, [...proposal.tokens], proposal.q, null, ms, prefilled);
    if (leaves > 0) {
      if (!proposal.alternatives) throw new Error("a tree needs the drafter's runner-up tokens: greedy drafting with the draft model");
      addLeaves(block, proposal.alternatives, leaves);
    }
    return block;
  }

  /** The guessed bonus token of the block before, then k drafts after it, for `round`. */
  async ahead(round: number, k: number): Promise<Block> {
    const guess = await this.timed(1, this.draws(round, true), false);
    const drafts = await this.timed(k, this.draws(round, false), false);
    return new Block(round, [...drafts.proposal.tokens], drafts.proposal.q, guess.proposal.tokens[0]!, guess.ms + drafts.ms);
  }

  /** What the shadow drafts with while streaming: this request's settings. */
  shadowSettings(): ShadowSettings {
    const o = this.options;
    return { lookup: o.lookup, sampling: o.sampling, lookupWeight: o.lookupWeight, topN: o.topN, coupledSeed: this.coupled && o.sampling ? this.seed : null };
  }

  /** Leaves the drafter's context at `committed`, keeping whatever cache is still valid. */
  sync(committed: readonly number[]): void {
    const tokens = this.drafter.tokens;
    if (tokens.length >= committed.length && committed.every((t, i) => tokens[i] === t)) this.drafter.rollbackTo(committed.length);
    else this.drafter.reset(committed);
  }
}
