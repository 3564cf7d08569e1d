/**
 * The model side's drafting terms: what `propose` takes and returns. They are shaped to fit the
 * generation loop's `Drafter` (src/drafter.ts) structurally, and also take the model's own
 * finer settings (explicit draws, a lookup configuration), as edge/draft.py's keywords do.
 */

import type { LookupConfig } from "./lookup.js";
import type { DraftManifest } from "./manifest.js";
import { type Draws, GUESS_SALT, PositionDraws, type SamplingParams, type SparseDist, roundDraws } from "./sampling.js";
import type { Tokenizer } from "./tokenizer.js";

/** Which draws a proposal makes (the loop's DrawsSpec): coupled by (seed, position), else the round's stream. */
export interface DrawsSpec {
  seed: bigint;
  round: number;
  coupled: boolean;
  /** The draws of a bonus guess before `round`, kept apart from the round's own. */
  guess: boolean;
}

export interface ProposeOptions {
  /** null or temperature 0: greedy. */
  sampling?: SamplingParams | null;
  /** The draws, as the loop names them; `rng` (explicit draws) wins over it. */
  draws?: DrawsSpec | null;
  rng?: Draws;
  /** Sampled: q cut to its topN most likely tokens (0: all). */
  topN?: number;
  /** Context lookup: true (the defaults), a configuration, or off. */
  lookup?: boolean | LookupConfig | null;
  /** Sampled: the lookup's point mass in q (1: the lookup alone decides). */
  lookupWeight?: number;
  /** Greedy: also return each draft's runner-up (tree drafts). */
  alternatives?: boolean;
}

export interface Proposal {
  tokens: number[];
  /** The distribution each draft was drawn from; null when greedy. */
  q: SparseDist[] | null;
  draftMs: number;
  /** Greedy with `alternatives`: per draft, [the runner-up token, the model's probability of the draft]. */
  alternatives: Array<[number, number]> | null;
}

export interface Drafter {
  readonly manifest: DraftManifest;
  readonly tokenizer: Tokenizer;
  readonly vocabSize: number;
  readonly eosTokenIds: number[];
  tokens: number[];
  fork(): Drafter;
  reset(contextIds: readonly number[]): void;
  append(tokenIds: readonly number[]): void;
  rollbackTo(n: number): void;
  propose(k: number, options?: ProposeOptions): Promise<Proposal>;
  observe(tokenIds: readonly number[], lookup?: LookupConfig): Promise<number[]>;
}

/** The draws a proposal uses: `rng`, else those `draws` names (coupled: one object for every round). */
export function drawsFor(options: ProposeOptions): Draws | undefined {
  if (options.rng) return options.rng;
  const spec = options.draws;
  if (!spec) return undefined;
  if (spec.coupled) return new PositionDraws(spec.seed);
  return roundDraws(spec.seed, spec.round, spec.guess ? GUESS_SALT : undefined);
}

/** `ids` as a fresh array, or an error naming `what` for a non-integer or out-of-vocabulary id. */
export function checkedTokenIds(ids: readonly number[], vocabSize: number, what: string): number[] {
  const out: number[] = [];
  for (const token of ids) {
    if (!Number.isInteger(token)) throw new RangeError(`${what} must hold integer token ids, got ${String(token)}`);
    if (token < 0 || token >= vocabSize) throw new RangeError(`${what} holds token id ${token}, outside this draft's vocabulary [0, ${vocabSize})`);
    out.push(token);
  }
  return out;
}
