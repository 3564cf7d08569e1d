/**
 * What the generation loop needs of a drafter (edge/drafter.py's protocol): the ONNX draft
 * (src/model: `loadDraft`) implements it, and so can any other source of drafts.
 *
 * A drafter holds a context (`tokens`) and proposes drafts after it. The loop keeps the context
 * equal to the committed tokens plus the drafts in flight: `propose` appends its drafts,
 * `rollbackTo` cuts them off again, `append` adds the verifier's tokens, `reset` starts over.
 */

import type { DrawsSpec } from "./model/drafter.js";
import type { PositionDraws } from "./model/index.js";
import type { SamplingParams } from "./params.js";
import type { SparseDist } from "./wire.js";

export interface Proposal {
  /** d1..dk */
  tokens: number[];
  /** The distribution each draft was sampled from; null when greedy. */
  q: SparseDist[] | null;
  draftMs?: number;
  /** Greedy with `alternatives`: per draft, [the runner-up token, the model's probability of the draft]. */
  alternatives?: Array<[number, number]> | null;
}

/** Which random draws a proposal makes: coupled (keyed by seed and absolute position) or a round's stream. */
export type { DrawsSpec };

export interface ProposeOptions {
  /** null: greedy. */
  sampling: SamplingParams | null;
  draws: DrawsSpec | null;
  /** Exact and coupled modes: q cut to its topN most likely tokens (0: all). */
  topN: number;
  /** Context lookup on or off. */
  lookup: boolean;
  lookupWeight: number;
  alternatives: boolean;
}

export interface Drafter {
  readonly tokenizerFingerprint: string;
  /** The most positions the draft can see: past it the cloud finishes alone. */
  readonly maxPositions: number;
  readonly vocabSize: number;
  /** The default stop tokens. */
  readonly eosTokenIds: readonly number[];
  /** The context: committed tokens plus the drafts in flight. */
  readonly tokens: readonly number[];
  /** A drafter with its own context and cache, sharing the weights (one per generation). */
  fork(): Drafter;
  reset(contextIds: readonly number[]): void;
  append(tokenIds: readonly number[]): void;
  rollbackTo(n: number): void;
  propose(k: number, options: ProposeOptions): Promise<Proposal> | Proposal;
  /**
   * The shadow (optional): appends streamed tokens and returns what greedy drafting would have
   * proposed at each (`observe`), or each one's chance of acceptance when sampling (`observeChances`).
   */
  observe?(tokenIds: readonly number[], lookup?: LookupSettings): Promise<number[]>;
  observeChances?(tokenIds: readonly number[], options: ObserveChancesOptions): Promise<number[]>;
}

/** Context lookup's suffix lengths and window (src/model's lookupConfig()). */
export interface LookupSettings {
  maxN: number;
  minN: number;
  window: number;
}

export interface ObserveChancesOptions {
  sampling: SamplingParams;
  lookup?: LookupSettings;
  lookupWeight?: number;
  topN?: number;
  targetProbs?: ReadonlyArray<number | null>;
  /** Coupled mode: the position draws (src/model's PositionDraws). */
  draws?: PositionDraws;
}

/** Text in and out: the draft's tokenizer, which is the target's. */
export interface TextCodec {
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
  /** Chat messages through the draft's chat template, as the prompt's token ids. */
  applyChatTemplate?(messages: ChatMessage[]): number[];
}

export interface ChatMessage {
  role: string;
  content: string;
}
