/**
 * What a block of k drafts commits: the planner's acceptance estimator (edge/acceptance.py).
 *
 * Position i of a block is reached when drafts 1..i-1 were accepted (a block sent ahead continues
 * the positions of the ones before it that held). Per position, decayed counts of reached and
 * accepted give c_i = P(draft i accepted | position i reached); a round of k
 * drafts commits on average E[tokens | k] = 1 + sum_{i=1..k} c_1 ... c_i, and a block of k sent
 * ahead holds with c_1 ... c_(k+1). Each c_i is shrunk towards c_(i-1) (c_1 towards the prior).
 */

const MAX_C = 0.99; // a position always accepted so far is no proof of certainty

export class Acceptance {
  reached: number[] = [];
  accepted: number[] = [];
  seen = 0;

  constructor(readonly decay: number, readonly shrink: number, readonly prior: number) {}

  /**
   * A verified round: `accepted` of `k` drafts. `after`: the block went ahead of blocks that held,
   * whose drafts and bonus guesses were its first `after` positions (the last bonus guess,
   * accepted). Positions past `limit` are not kept.
   */
  add(accepted: number, k: number, after = 0, limit?: number): void {
    const reached = [...new Array(after).fill(0), ...new Array(Math.min(accepted + 1, k)).fill(1)];
    const hits = [...new Array(after).fill(0), ...new Array(accepted).fill(1)];
    if (after > 0) reached[after - 1] = hits[after - 1] = 1;
    this.addCounts(reached.slice(0, limit), hits.slice(0, limit));
  }

  /** Per-position counts of `rounds` rounds (fractional for replayed ones): what was there before weighs decay ** rounds. */
  addCounts(reached: number[], accepted: number[], rounds = 1): void {
    this.seen += reached.reduce((a, b) => a + b, 0);
    const decay = this.decay ** rounds;
    const size = Math.max(reached.length, this.reached.length);
    const grow = (xs: number[]) => [...xs.map((x) => decay * x), ...new Array(Math.max(0, size - xs.length)).fill(0)];
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
 * Rounds of `k` drafts replayed over streamed tokens, from each token's chance that a draft there
 * would have been accepted. The state is the chance of each block position (and of the bonus) at
 * the next token: a chance of 0.6 sends 0.6 of the block on and ends 0.4 of it; with chances of 0
 * and 1 this is the exact replay of greedy rounds.
 */
export class Replay {
  readonly k: number;
  private mass: number[] = [];
  private bonus = 0;

  constructor(k: number) {
    this.k = Math.max(1, Math.floor(k));
    this.restart();
  }

  /** A gap in the stream (the shadow rested): the next token starts a fresh block. */
  restart(): void {
    this.mass = [1, ...new Array(this.k - 1).fill(0)];
    this.bonus = 0;
  }

  /** Advances over the tokens; returns their per-position [reached, accepted] counts and the rounds they ended. */
  feed(chances: number[]): [number[], number[], number] {
    const reached = new Array<number>(this.k).fill(0);
    const accepted = new Array<number>(this.k).fill(0);
    let ended = 0;
    for (const chance of chances) {
      const p = Math.min(Math.max(chance, 0), 1);
      const next = new Array<number>(this.k).fill(0);
      next[0] = this.bonus; // a bonus token ends its round, no draft of its own
      ended += this.bonus;
      let bonus = 0;
      this.mass.forEach((m, i) => {
        reached[i]! += m;
        accepted[i]! += m * p;
        next[0]! += m * (1 - p); // rejected: the streamed token was the round's correction
        ended += m * (1 - p);
        if (i + 1 < this.k) next[i + 1]! += m * p;
        else bonus += m * p;
      });
      this.mass = next;
      this.bonus = bonus;
    }
    return [reached, accepted, ended];
  }
}
