/**
 * What a block of k drafts commits: the planner's acceptance estimator (edge/acceptance.py).
 *
 * Position i of a block is reached when drafts 1..i-1 were accepted. Per position, decayed counts
 * of reached and accepted give c_i = P(draft i accepted | position i reached); a round of k
 * drafts commits on average E[tokens | k] = 1 + sum_{i=1..k} c_1 ... c_i, and a block of k sent
 * ahead holds with c_1 ... c_(k+1). Each c_i is shrunk towards c_(i-1) (c_1 towards the prior).
 */

const MAX_C = 0.99; // a position always accepted so far is no proof of certainty

export class Acceptance {
  reached: number[] = [];
  accepted: number[] = [];
  seen = 0;

  constructor(readonly decay: number, readonly shrink: number, readonly prior: number) {}

  /** A verified round: `accepted` of `k` drafts. */
  add(accepted: number, k: number): void {
    const reached = Math.min(accepted + 1, k);
    this.addCounts(new Array(reached).fill(1), new Array(accepted).fill(1));
  }

  /** A round's per-position counts (fractional for a replayed one). */
  addCounts(reached: number[], accepted: number[]): void {
    this.seen += reached.reduce((a, b) => a + b, 0);
    const size = Math.max(reached.length, this.reached.length);
    const grow = (xs: number[]) => [...xs.map((x) => this.decay * x), ...new Array(Math.max(0, size - xs.length)).fill(0)];
    this.reached = grow(this.reached);
    this.accepted = grow(this.accepted);
    reached.forEach((r, i) => {
      this.reached[i]! += r;
      this.accepted[i]! += accepted[i] ?? 0;
    });
  }

  /** Counts so far weigh `weight` (a new text: the last one says less of it). */
  forget(weight: number): void {
    this.reached = this.reached.map((r) => weight * r);
    this.accepted = this.accepted.map((a) => weight * a);
  }

  /** Drafts observed (decayed): what the estimates rest on. */
  drafts(): number {
    return this.reached.reduce((a, b) => a + b, 0);
  }

  /** c_1..c_n, each shrunk towards the one before it. */
  byPosition(n: number): number[] {
    const out: number[] = [];
    let previous = this.prior;
    for (let i = 0; i < n; i++) {
      const r = this.reached[i] ?? 0;
      const a = this.accepted[i] ?? 0;
      previous = Math.min((a + this.shrink * previous) / (r + this.shrink), MAX_C);
      out.push(previous);
    }
    return out;
  }

  /** Per k (index k, 1..maxK): E[tokens | k] and the chance a block of k sent ahead holds. */
  tokensAndHolds(maxK: number): [number[], number[]] {
    const c = this.byPosition(maxK + 1);
    const tokens = [1];
    const holds = [0];
    let survive = 1;
    for (let k = 1; k <= maxK; k++) {
      survive *= c[k - 1]!;
      tokens.push(tokens[k - 1]! + survive);
      holds.push(survive * c[k]!);
    }
    return [tokens, holds];
  }
}

/**
 * Rounds of `k` drafts replayed over streamed tokens the device did not draft, from each token's
 * chance that a draft there would have been accepted (greedy: 1 or 0).
 */
export class Replay {
  readonly k: number;
  private mass: number[] = [];
  private bonus = 0;
  private reached: number[] = [];
  private accepted: number[] = [];
  private ended = 0;

  constructor(k: number) {
    this.k = Math.max(1, Math.floor(k));
    this.restart();
  }

  /** A gap in the stream: the next token starts a fresh block. Returns the round in progress, if any. */
  restart(): Array<[number[], number[]]> {
    const pending: Array<[number[], number[]]> = this.reached.reduce((a, b) => a + b, 0) > 0 ? [[this.reached, this.accepted]] : [];
    this.mass = [1, ...new Array(this.k - 1).fill(0)];
    this.bonus = 0;
    this.reached = new Array(this.k).fill(0);
    this.accepted = new Array(this.k).fill(0);
    this.ended = 0;
    return pending;
  }

  /** Advances over the tokens; returns each full round's (reached, accepted) counts. */
  feed(chances: number[]): Array<[number[], number[]]> {
    const out: Array<[number[], number[]]> = [];
    for (const chance of chances) {
      const p = Math.min(Math.max(chance, 0), 1);
      const next = new Array(this.k).fill(0);
      next[0] = this.bonus; // a bonus token ends its round, no draft of its own
      let ended = this.bonus;
      let bonus = 0;
      this.mass.forEach((m, i) => {
        this.reached[i]! += m;
        this.accepted[i]! += m * p;
        next[0] += m * (1 - p); // rejected: the streamed token was the round's correction
        ended += m * (1 - p);
        if (i + 1 < this.k) next[i + 1] += m * p;
        else bonus += m * p;
      });
      this.mass = next;
      this.bonus = bonus;
      this.ended += ended;
      if (this.ended >= 1) {
        out.push([this.reached, this.accepted]);
        this.reached = new Array(this.k).fill(0);
        this.accepted = new Array(this.k).fill(0);
        this.ended = 0;
      }
    }
    return out;
  }
}
