/**
 * Draft-side sampling, as edge/sampling.py: logits -> the processed distribution (temperature,
 * top-k, top-p) -> a sparse q cut to its top_n tokens -> a token drawn from exactly that q.
 *
 * Coupled mode draws with exponentials keyed by (seed, absolute position, token id): the
 * splitmix64 hash of docs/protocol.md "Coupled sampling", reproduced bit for bit here (64-bit
 * arithmetic on pairs of 32-bit halves; the seed may be a bigint up to 2^64 - 1). Exact and
 * token modes draw from a per-round stream (`roundDraws`): any uniform source keeps them
 * lossless, and this one is seeded by (seed, round) so a retried round draws the same numbers
 * (it is not numpy's PCG64 stream, so a sampled exact-mode text differs from the Python SDK's
 * for one seed; a coupled text is the same).
 */

export interface SamplingParams {
  /** 0: greedy (argmax). */
  temperature: number;
  /** Keep the top_k most likely tokens; 0 disables. */
  topK?: number;
  /** Keep the smallest set of most likely tokens whose mass reaches top_p; 1 disables. */
  topP?: number;
  /** Keys every draw (coupled: with the absolute position); up to 2^64 - 1. */
  seed?: bigint | number;
}

export const isGreedy = (params: SamplingParams | null | undefined): boolean => !params || params.temperature === 0;

/** A distribution over some token ids, by decreasing probability (ties by id). */
export class SparseDist {
  constructor(readonly tokenIds: Int32Array, readonly probs: Float64Array) {
    if (tokenIds.length === 0 || tokenIds.length !== probs.length) {
      throw new Error(`SparseDist needs token ids and probs of the same non-zero length, got ${tokenIds.length} and ${probs.length}`);
    }
  }

  probOf(tokenId: number): number {
    const at = this.tokenIds.indexOf(tokenId);
    return at < 0 ? 0 : this.probs[at];
  }
}

/** numpy's pairwise summation (what `ndarray.sum` does to a float64 vector), so sums agree to the bit. */
export function pairwiseSum(values: Float64Array, start = 0, n = values.length): number {
  if (n < 8) {
    let sum = -0;
    for (let i = start; i < start + n; i++) sum += values[i];
    return sum;
  }
  if (n <= 128) {
    const r = [values[start], values[start + 1], values[start + 2], values[start + 3],
      values[start + 4], values[start + 5], values[start + 6], values[start + 7]];
    let i = 8;
    for (; i < n - (n % 8); i += 8) for (let j = 0; j < 8; j++) r[j] += values[start + i + j];
    let sum = (r[0] + r[1] + (r[2] + r[3])) + (r[4] + r[5] + (r[6] + r[7]));
    for (; i < n; i++) sum += values[start + i];
    return sum;
  }
  let half = Math.floor(n / 2);
  half -= half % 8;
  return pairwiseSum(values, start, half) + pairwiseSum(values, start + half, n - half);
}

function argmax(values: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

/** The processed distribution [V] (float64, sums to 1): temperature, then top-k, then top-p. */
export function probsFromLogits(logits: ArrayLike<number>, params: SamplingParams): Float64Array {
  const n = logits.length;
  if (n === 0) throw new Error("logits must be a non-empty vector [V]");
  let max = -Infinity;
  for (let i = 0; i < n; i++) {
    const x = logits[i];
    if (Number.isNaN(x)) throw new Error("logits contain NaN; the draft model produced invalid output");
    if (x > max) max = x;
  }
  if (!Number.isFinite(max)) throw new Error("logits have no finite maximum (all -inf, or +inf present)");
  const out = new Float64Array(n);
  if (isGreedy(params)) {
    out[argmax(logits)] = 1;
    return out;
  }
  for (let i = 0; i < n; i++) out[i] = Math.exp((logits[i] - max) / params.temperature);
  const topK = params.topK ?? 0;
  if (topK > 0 && topK < n) {
    // NOTE: keeps exactly top_k entries; on a tie at the boundary the lower ids stay (numpy's
    // argpartition leaves that choice open: a tie there is all but impossible in float logits).
    const order = byDecreasing(out);
    for (let i = topK; i < n; i++) out[order[i]] = 0;
  }
  let sum = pairwiseSum(out);
  for (let i = 0; i < n; i++) out[i] /= sum;
  const topP = params.topP ?? 1;
  if (topP < 1) {
    const order = byDecreasing(out);
    const keep = new Float64Array(n);
    let cumulative = 0;
    for (const i of order) {
      cumulative += out[i];
      // (the same slack as Python's: a prefix reaching top_p exactly admits no extra token)
      if (cumulative - out[i] < topP * (1 - 1e-9)) keep[i] = out[i];
    }
    sum = pairwiseSum(keep);
    for (let i = 0; i < n; i++) out[i] = keep[i] / sum;
  }
  return out;
}

/** Indices by decreasing value, ties by index (a stable sort of -values). */
function byDecreasing(values: Float64Array, indices?: number[]): number[] {
  const order = indices ?? Array.from(values.keys());
  return order.sort((a, b) => values[b] - values[a] || a - b);
}

/** The n most likely tokens of `probs`, renormalised; n <= 0: every positive entry. */
export function truncateTopN(probs: Float64Array, n: number): SparseDist {
  const positive: number[] = [];
  for (let i = 0; i < probs.length; i++) if (probs[i] > 0) positive.push(i);
  if (positive.length === 0) throw new Error("probs has no positive entry");
  let order = byDecreasing(probs, positive);
  if (n > 0) order = order.slice(0, n);
  const kept = Float64Array.from(order, (i) => probs[i]);
  const sum = pairwiseSum(kept);
  return new SparseDist(Int32Array.from(order), kept.map((p) => p / sum));
}

/** q = 1 on `tokenId`: a context lookup's proposal as a draft distribution. */
export function pointMass(tokenId: number): SparseDist {
  return new SparseDist(Int32Array.of(tokenId), Float64Array.of(1));
}

/** q = weight * (point mass on tokenId) + (1 - weight) * dist, within topN entries (edge/sampling.py). */
export function mixPointMass(dist: SparseDist, tokenId: number, weight: number, topN = 0): SparseDist {
  if (!(weight >= 0 && weight <= 1)) throw new Error(`weight must be in [0, 1], got ${weight}`);
  if (weight === 1) return pointMass(tokenId);
  if (weight === 0) return dist;
  let ids = Array.from(dist.tokenIds);
  let probs = Array.from(dist.probs);
  if (!ids.includes(tokenId) && topN > 0 && topN <= ids.length) {
    ids = ids.slice(0, topN - 1);
    const kept = Float64Array.from(probs.slice(0, topN - 1));
    const sum = pairwiseSum(kept);
    probs = Array.from(kept, (p) => p / sum);
  }
  const mixed = new Map<number, number>(ids.map((id, i) => [id, (1 - weight) * probs[i]]));
  mixed.set(tokenId, (mixed.get(tokenId) ?? 0) + weight);
  const order = [...mixed.keys()].sort((a, b) => mixed.get(b)! - mixed.get(a)! || a - b);
  const weights = Float64Array.from(order, (t) => mixed.get(t)!);
  const sum = pairwiseSum(weights);
  return new SparseDist(Int32Array.from(order), weights.map((w) => w / sum));
}

// ---- position-keyed draws (coupled mode), docs/protocol.md "Coupled sampling" ---------------

const TWO32 = 4294967296;
const GAMMA: U64 = [0x9e3779b9, 0x7f4a7c15];
const M1: U64 = [0xbf58476d, 0x1ce4e5b9];
const M2: U64 = [0x94d049bb, 0x133111eb];
const U53 = 2 ** -53;
const U_MIN = 2 ** -54;

/** An unsigned 64-bit integer as [high 32 bits, low 32 bits]. */
export type U64 = [number, number];

function add64(a: U64, b: U64): U64 {
  const low = a[1] + b[1];
  return [(a[0] + b[0] + (low >= TWO32 ? 1 : 0)) >>> 0, low >>> 0];
}

function mul64(a: U64, b: U64): U64 {
  const [ah, al] = a;
  const [bh, bl] = b;
  const a0 = al & 0xffff, a1 = al >>> 16, b0 = bl & 0xffff, b1 = bl >>> 16;
  const m1 = a1 * b0 + ((a0 * b0) >>> 16);
  const m2 = a0 * b1 + (m1 % 65536);
  const high = a1 * b1 + Math.floor(m1 / 65536) + Math.floor(m2 / 65536); // the high half of al * bl
  return [(high + Math.imul(ah, bl) + Math.imul(al, bh)) >>> 0, Math.imul(al, bl) >>> 0];
}

/** z ^ (z >> s), 0 < s < 32. */
function xorShift(z: U64, s: number): U64 {
  return [(z[0] ^ (z[0] >>> s)) >>> 0, (z[1] ^ ((z[1] >>> s) | (z[0] << (32 - s)))) >>> 0];
}

/** splitmix64's output for state x. */
export function mix64(x: U64): U64 {
  let z = add64(x, GAMMA);
  z = mul64(xorShift(z, 30), M1);
  z = mul64(xorShift(z, 27), M2);
  return xorShift(z, 31);
}

export function toU64(value: bigint | number): U64 {
  const big = BigInt(value);
  if (big < 0n || big >= 1n << 64n) throw new Error(`not an unsigned 64-bit integer: ${value}`);
  return [Number(big >> 32n), Number(big & 0xffffffffn)];
}

export const u64ToBigInt = (x: U64): bigint => (BigInt(x[0]) << 32n) | BigInt(x[1]);

/** key(seed, P) = mix64(mix64(seed) ^ P). */
export function positionKey(seed: bigint | number, position: number): U64 {
  if (!Number.isSafeInteger(position) || position < 0) throw new Error(`position must be an integer >= 0, got ${position}`);
  const s = mix64(toU64(seed));
  const p = toU64(position);
  return mix64([(s[0] ^ p[0]) >>> 0, (s[1] ^ p[1]) >>> 0]);
}

/** u(seed, P, v) in (0, 1): the top 53 bits of mix64(key ^ v), 2^-54 where that is 0. */
export function positionUniforms(seed: bigint | number, position: number, tokenIds: ArrayLike<number>): Float64Array {
  const key = positionKey(seed, position);
  const out = new Float64Array(tokenIds.length);
  for (let i = 0; i < tokenIds.length; i++) {
    const v = tokenIds[i];
    const bits = mix64([key[0] ^ Math.floor(v / TWO32), (key[1] ^ v) >>> 0]);
    out[i] = Math.max((bits[0] * 2097152 + (bits[1] >>> 11)) * U53, U_MIN);
  }
  return out;
}

/** E(seed, P, v) = -log u ~ Exp(1). */
export function positionExponentials(seed: bigint | number, position: number, tokenIds: ArrayLike<number>): Float64Array {
  const u = positionUniforms(seed, position, tokenIds);
  for (let i = 0; i < u.length; i++) u[i] = -Math.log(u[i]);
  return u;
}

/** argmax weights / exponentials, the first on ties. */
export function race(weights: ArrayLike<number>, exponentials: ArrayLike<number>): number {
  let best = 0;
  let bestValue = weights[0] / exponentials[0];
  for (let i = 1; i < weights.length; i++) {
    const value = weights[i] / exponentials[i];
    if (value > bestValue) {
      best = i;
      bestValue = value;
    }
  }
  return best;
}

/** t_P: the verifier's coupled token for the full distribution probs [V] (for checks). */
export function coupledToken(probs: Float64Array, seed: bigint | number, position: number): number {
  const support: number[] = [];
  for (let i = 0; i < probs.length; i++) if (probs[i] > 0) support.push(i);
  if (support.length === 0) throw new Error("probs has no positive entry");
  const weights = support.map((i) => probs[i]);
  return support[race(weights, positionExponentials(seed, position, support))];
}

/** The device's coupled draws: the token at an absolute position from a q, raced with that position's exponentials. */
export class PositionDraws {
  readonly kind = "position";
  constructor(readonly seed: bigint | number) {
    toU64(seed);
  }

  sample(dist: SparseDist, position: number | undefined): number {
    if (dist.tokenIds.length === 1) return dist.tokenIds[0]; // a point mass needs no draw
    if (position === undefined) throw new Error("coupled draws need the absolute position of the drafted token");
    return dist.tokenIds[race(dist.probs, positionExponentials(this.seed, position, dist.tokenIds))];
  }
}

/** A round's uniform stream (exact and token modes): splitmix64 from a state keyed by (seed, round). */
export class RoundDraws {
  readonly kind = "round";
  private state: U64;

  constructor(seed: bigint | number, round: number, salt: number = ROUND_SALT) {
    const keyed = mix64(toU64(seed));
    const r = toU64(round);
    this.state = mix64([(keyed[0] ^ r[0]) >>> 0, (keyed[1] ^ r[1] ^ salt) >>> 0]);
  }

  /** A uniform float64 in [0, 1). */
  random(): number {
    this.state = add64(this.state, GAMMA);
    const z = mix64(this.state);
    return (z[0] * 2097152 + (z[1] >>> 11)) * U53;
  }
}

/** Salts that keep a round's streams apart: its drafts (edge/sampling.py's _ROUND_SALT), its bonus guess (GUESS_SALT). */
export const ROUND_SALT = 0xed6e;
export const GUESS_SALT = 0xb0;

export type Draws = PositionDraws | RoundDraws;

export const roundDraws = (seed: bigint | number, round: number, salt = ROUND_SALT): RoundDraws => new RoundDraws(seed, round, salt);

/** One token drawn from exactly `dist`: by inverting its CDF (a round's stream) or by the position's race (coupled). */
export function sample(dist: SparseDist, draws: Draws, position?: number): number {
  if (draws.kind === "position") return draws.sample(dist, position);
  const cdf = new Float64Array(dist.probs.length);
  let total = 0;
  dist.probs.forEach((p, i) => (cdf[i] = total += p));
  const u = draws.random() * total;
  let index = cdf.findIndex((c) => c > u);
  if (index < 0) index = cdf.length - 1;
  return dist.tokenIds[index];
}
