/**
 * Context lookup, as edge/lookup.py and edge/lookup_draft.py: the token that followed the most
 * recent earlier occurrence of the context's longest matching suffix (docs/protocol.md's
 * pseudo-code), and a drafter that drafts from the context alone.
 */

import type { Drafter, ProposeOptions, Proposal } from "./drafter.js";
import { checkedTokenIds } from "./drafter.js";
import { isGreedy, pointMass, sample, type SparseDist } from "./sampling.js";

export interface LookupConfig {
  maxN: number;
  minN: number;
  window: number;
}

/** The defaults: suffixes of 4 down to 2 tokens, within the last 1,024 tokens. */
export function lookupConfig(options: Partial<LookupConfig> = {}): LookupConfig {
  const config = { maxN: 4, minN: 2, window: 1024, ...options };
  if (!(config.minN >= 1 && config.minN <= config.maxN)) {
    throw new Error(`lookup needs 1 <= minN <= maxN, got minN=${config.minN} maxN=${config.maxN}`);
  }
  if (config.window < config.maxN + 1) throw new Error(`lookup window must be > maxN, got window=${config.window} maxN=${config.maxN}`);
  return config;
}

/** The token after the most recent earlier occurrence of the longest matching suffix, or undefined. */
export function lookupNext(tokens: readonly number[], config: LookupConfig): number | undefined {
  const end = tokens.length;
  const start = Math.max(0, end - config.window);
  for (let n = Math.min(config.maxN, end - 1); n >= config.minN; n--) {
    for (let i = end - n - 1; i >= start; i--) {
      let match = true;
      for (let j = 0; j < n && match; j++) match = tokens[i + j] === tokens[end - n + j];
      if (match) return tokens[i + n];
    }
  }
  return undefined;
}

const BIGRAM: LookupConfig = { maxN: 1, minN: 1, window: 1024 };

/** Drafts from the context only (lookup-only speculation); `model` lends its manifest and tokenizer, never runs. */
export class LookupDraft implements Drafter {
  tokens: number[] = [];
  readonly manifest: Drafter["manifest"];
  readonly tokenizer: Drafter["tokenizer"];
  readonly vocabSize: number;
  readonly eosTokenIds: number[];

  constructor(readonly model: Drafter, readonly config: LookupConfig = lookupConfig()) {
    this.manifest = model.manifest;
    this.tokenizer = model.tokenizer;
    this.vocabSize = model.vocabSize;
    this.eosTokenIds = model.eosTokenIds;
  }

  fork(): LookupDraft {
    return new LookupDraft(this.model, this.config);
  }

  reset(contextIds: readonly number[]): void {
    this.tokens = checkedTokenIds(contextIds, this.vocabSize, "contextIds");
  }

  append(tokenIds: readonly number[]): void {
    this.tokens.push(...checkedTokenIds(tokenIds, this.vocabSize, "tokenIds"));
  }

  rollbackTo(n: number): void {
    if (!(Number.isInteger(n) && n >= 0 && n <= this.tokens.length)) {
      throw new Error(`rollbackTo(${n}) is outside [0, ${this.tokens.length}] (the current context length)`);
    }
    this.tokens.length = n;
  }

  /** The next token from the context alone: the lookup, else the last token's bigram, else the last token. */
  guess(lookup?: LookupConfig): number {
    const found = lookupNext(this.tokens, lookup ?? this.config) ?? lookupNext(this.tokens, BIGRAM);
    return found ?? this.tokens[this.tokens.length - 1];
  }

  async propose(k: number, options: ProposeOptions = {}): Promise<Proposal> {
    if (!Number.isInteger(k) || k < 1) throw new Error(`k must be an integer >= 1, got ${k}`);
    if (this.tokens.length === 0) throw new Error("the context is empty: call reset(promptIds) with at least one token first");
    if (options.alternatives) throw new Error("a lookup-only draft has no runner-up tokens: tree drafts need the draft model");
    const sampled = !isGreedy(options.sampling);
    if (sampled && !options.rng) throw new Error("sampling needs the round's draws (rng)");
    const lookup = typeof options.lookup === "object" && options.lookup ? options.lookup : undefined;
    const started = performance.now();
    const drafts: number[] = [];
    const q: SparseDist[] = [];
    for (let i = 0; i < k; i++) {
      const token = this.guess(lookup);
      if (sampled) {
        const dist = pointMass(token);
        sample(dist, options.rng!); // NOTE: drawn anyway, so the round's stream matches a model draft's
        q.push(dist);
      }
      this.tokens.push(token);
      drafts.push(token);
    }
    return { tokens: drafts, q: sampled ? q : null, draftMs: performance.now() - started, alternatives: null };
  }

  async observe(tokenIds: readonly number[], lookup?: LookupConfig): Promise<number[]> {
    const predicted: number[] = [];
    for (const token of checkedTokenIds(tokenIds, this.vocabSize, "tokenIds")) {
      predicted.push(this.guess(lookup));
      this.tokens.push(token);
    }
    return predicted;
  }

  async observeChances(tokenIds: readonly number[], options: { lookup?: LookupConfig } = {}): Promise<number[]> {
    const guesses = await this.observe(tokenIds, options.lookup);
    return guesses.map((guess, i) => (guess === tokenIds[i] ? 1 : 0));
  }
}
