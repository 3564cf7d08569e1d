/**
 * A generation's parameters, validated once (errors name the field), as edge/params.py's
 * GenerationParams: the sampling parameters that define p and the device's own choices.
 *
 * Modes (p = target, q = draft): greedy (token-identical to the target's greedy output), coupled
 * (sampled, tokens only on the wire, draws keyed by seed and absolute position: one seed, one
 * text), exact (q on the wire), token (tokens only, the point-mass rule).
 */

export type Mode = "greedy" | "exact" | "token" | "coupled";
export const MODES: readonly Mode[] = ["greedy", "exact", "token", "coupled"];

export const MIN_TEMPERATURE = 1e-3;
export const MAX_TEMPERATURE = 100;
export const MAX_SEED = (1n << 64n) - 1n;
export const MAX_SEND_AHEAD = 8;
export const MAX_TREE_EXTRA = 16;
/** draftTemperature "auto": the draft samples q at this fraction of the target's temperature. */
export const DRAFT_TEMPERATURE_RATIO = 0.8;

/** What `generate` and `stream` take (every field optional; defaults as the Python SDK's). */
export interface GenerationOptions {
  maxNewTokens?: number;
  /** 0 (default): greedy; else in [0.001, 100]. */
  temperature?: number;
  topK?: number;
  topP?: number;
  /** Keys every draw; unset: a fresh 63-bit seed per sampled request (reported in stats.seed). */
  seed?: bigint | number;
  mode?: Mode;
  /** Drafts per round: a number or "auto" (adaptive). */
  k?: number | "auto";
  /** Default: the draft's end-of-sequence ids. */
  stopTokenIds?: readonly number[];
  topN?: number;
  lookup?: boolean | "only";
  lookupWeight?: number;
  draftTemperature?: number | "auto";
  /** "auto": speculation or cloud-only by measured figures (k "auto"); true: speculate; false: cloud-only. */
  speculate?: boolean | "auto";
  /** Most blocks in flight, or "auto". */
  sendAhead?: number | "auto";
  /** Greedy only: runner-up tokens riding along with a fresh block (a tree draft). */
  tree?: number;
}

export interface SamplingParams {
  temperature: number;
  topK: number;
  topP: number;
  seed: bigint;
}

export interface GenerationParams extends SamplingParams {
  maxNewTokens: number;
  mode: Mode;
  k: number | "auto";
  stopTokenIds: number[] | null;
  topN: number;
  lookup: boolean | "only";
  lookupWeight: number;
  draftTemperature: number | "auto";
  speculate: boolean | "auto";
  sendAhead: number | "auto";
  tree: number;
}

function isInt(value: unknown): value is number {
  return typeof value === "number" && Number.isInteger(value);
}

function fail(message: string): never {
  throw new RangeError(message);
}

/** A fresh seed from the OS's randomness: 63 bits (fits a signed int64 too). */
export function randomSeed(): bigint {
  const words = new Uint32Array(2);
  globalThis.crypto.getRandomValues(words);
  return ((BigInt(words[0]!) & 0x7fffffffn) << 32n) | BigInt(words[1]!);
}

export function parseK(k: unknown): number | "auto" {
  if (k === "auto") return k;
  if (typeof k === "string" && /^\d+$/.test(k)) k = Number(k);
  if (!isInt(k) || k < 1) fail(`k must be a positive integer or 'auto', got ${JSON.stringify(k)}`);
  return k;
}

function sampling(options: GenerationOptions, greedy: boolean): SamplingParams {
  const temperature = options.temperature ?? 0;
  if (!(typeof temperature === "number" && (temperature === 0 || (temperature >= MIN_TEMPERATURE && temperature <= MAX_TEMPERATURE)))) {
    fail(`temperature must be 0 (greedy) or in [${MIN_TEMPERATURE}, ${MAX_TEMPERATURE}], got ${temperature}`);
  }
  const topK = options.topK ?? 0;
  if (!isInt(topK) || topK < 0) fail(`topK must be an integer >= 0 (0 = off), got ${topK}`);
  const topP = options.topP ?? 1;
  if (!(typeof topP === "number" && Number.isFinite(topP) && topP > 0 && topP <= 1)) fail(`topP must be in (0, 1] (1 = off), got ${topP}`);
  let seed: bigint;
  if (options.seed === undefined) seed = greedy ? 0n : randomSeed();
  else if (typeof options.seed === "bigint") seed = options.seed;
  else if (isInt(options.seed) && Number.isSafeInteger(options.seed)) seed = BigInt(options.seed);
  else fail(`seed must be an integer in [0, 2^64) (a bigint beyond 2^53), got ${options.seed}`);
  if (seed < 0n || seed > MAX_SEED) fail(`seed must be an integer in [0, 2^64), got ${seed}`);
  return { temperature, topK, topP, seed };
}

/** Validated parameters with every default filled in. */
export function generationParams(options: GenerationOptions = {}): GenerationParams {
  const greedy = (options.temperature ?? 0) === 0;
  const base = sampling(options, greedy);
  const maxNewTokens = options.maxNewTokens ?? 128;
  if (!isInt(maxNewTokens) || maxNewTokens < 1) fail(`maxNewTokens must be an integer >= 1, got ${maxNewTokens}`);
  const mode = options.mode ?? (greedy ? "greedy" : "coupled");
  if (!MODES.includes(mode)) fail(`mode must be one of ${MODES.join(", ")}, got ${JSON.stringify(mode)}`);
  if (mode !== "greedy" && greedy) fail(`mode '${mode}' samples: set temperature > 0, or use mode 'greedy'`);
  const topN = options.topN ?? 64;
  if (!isInt(topN) || topN < 0) fail(`topN must be an integer >= 0 (0 = every token with q > 0), got ${topN}`);
  const speculate = options.speculate ?? "auto";
  if (speculate !== true && speculate !== false && speculate !== "auto") fail(`speculate must be true, false or 'auto', got ${speculate}`);
  const tree = options.tree ?? 0;
  if (!isInt(tree) || tree < 0 || tree > MAX_TREE_EXTRA) fail(`tree must be an integer in [0, ${MAX_TREE_EXTRA}] (extra tokens per block), got ${tree}`);
  if (tree && mode !== "greedy") fail("tree drafts are verified greedily: use mode 'greedy' (temperature 0), or tree 0");
  const lookup = options.lookup ?? true;
  if (lookup !== true && lookup !== false && lookup !== "only") fail(`lookup must be true, false or 'only' (no draft model), got ${lookup}`);
  if (tree && lookup === "only") fail("tree drafts take the draft model's runner-up tokens: lookup 'only' has none, use tree 0");
  const lookupWeight = options.lookupWeight ?? 1;
  if (!(typeof lookupWeight === "number" && lookupWeight >= 0 && lookupWeight <= 1)) fail(`lookupWeight must be in [0, 1], got ${lookupWeight}`);
  const draftTemperature = options.draftTemperature ?? "auto";
  if (draftTemperature !== "auto" && !(typeof draftTemperature === "number" && draftTemperature >= MIN_TEMPERATURE && draftTemperature <= MAX_TEMPERATURE)) {
    fail(`draftTemperature must be 'auto' or in [${MIN_TEMPERATURE}, ${MAX_TEMPERATURE}], got ${draftTemperature}`);
  }
  const sendAhead = options.sendAhead ?? "auto";
  if (sendAhead !== "auto" && (!isInt(sendAhead) || sendAhead < 1 || sendAhead > MAX_SEND_AHEAD)) {
    fail(`sendAhead must be 'auto' or an integer in [1, ${MAX_SEND_AHEAD}], got ${sendAhead}`);
  }
  const stop = options.stopTokenIds;
  if (stop !== undefined && (!Array.isArray(stop) || !stop.every(isInt))) fail("stopTokenIds must be an array of integer token ids");
  return {
    ...base, maxNewTokens, mode, k: parseK(options.k ?? "auto"), stopTokenIds: stop ? [...stop] : null, topN,
    lookup, lookupWeight, draftTemperature, speculate, sendAhead, tree,
  };
}

export function isGreedy(params: SamplingParams): boolean {
  return params.temperature === 0;
}

/** What the draft samples q with: p's parameters at the draft's own temperature. */
export function draftSampling(params: GenerationParams): SamplingParams {
  if (isGreedy(params)) return params;
  let t = params.draftTemperature;
  if (t === "auto") t = Math.min(MAX_TEMPERATURE, Math.max(MIN_TEMPERATURE, DRAFT_TEMPERATURE_RATIO * params.temperature));
  return { temperature: t, topK: params.topK, topP: params.topP, seed: params.seed };
}

/** Coupled mode on an older server that serves exact but not coupled: exact (edge/params.py's served_mode). */
export function servedMode(params: GenerationParams, modes: readonly string[]): GenerationParams {
  if (params.mode === "coupled" && !modes.includes("coupled") && modes.includes("exact")) return { ...params, mode: "exact" };
  return params;
}

/** The planner's mode for a request: auto only with adaptive k and speculate "auto". */
export function pathMode(params: GenerationParams): "auto" | "speculative" | "cloud_only" {
  if (params.speculate === false) return "cloud_only";
  return params.k === "auto" && params.speculate === "auto" ? "auto" : "speculative";
}
