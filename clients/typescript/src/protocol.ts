/**
 * The client's side of the protocol (docs/protocol.md) as a state machine with no I/O, a port of
 * edge/protocol.py. `ClientSession` builds the messages to send (Open, Draft, Close, a
 * GenerateRequest) and takes the messages received (Opened, Verdict, Generate tokens); it never
 * touches a socket, a clock, a model or a policy.
 *
 * What it tracks:
 * - committed: the prompt and every token a verdict (or a Generate message) committed; the
 *   output is committed.slice(promptLen);
 * - round numbers: the next round (`roundNo`): a verified round, or one cloud-only token;
 * - in flight: blocks sent on this stream whose verdicts have not come back, in send order; a
 *   block is stale once an assumption it rests on failed: its verdict says "discarded" and is skipped;
 * - resume: every Open carries every committed token, the budget left and the next round, so the
 *   output equals an uninterrupted run.
 */

import { Code, StatusError } from "./errors.js";
import type { GenerationParams } from "./params.js";
import type { Opened, Verdict } from "./gen/edgespec/v1/speculative_pb.js";
import {
  CLOSE_REQUEST, type GenerateRequest, type SessionRequest, type SparseDist,
  draftRequest, finishName, generateRequest, openRequest,
} from "./wire.js";

/** One drafted block on its way to the verifier. */
export class Block {
  /** Its assumption failed: its verdict will be "discarded". */
  stale = false;
  sentAt = 0;

  constructor(
    readonly roundNo: number,
    /** The drafts d1..dk (a tree: the chain first, then runner-up leaves). */
    readonly tokens: number[],
    /** Exact mode: the q each draft was sampled from. */
    readonly q: SparseDist[] | null,
    /** Sent ahead: the bonus token the block before it must emit. */
    readonly assumed: number | null = null,
    readonly draftMs = 0,
    /** Its drafting also fed the context (no per-token drafting time). */
    readonly prefilled = false,
    /** A tree: each token's parent index, -1 = the pending token. */
    public parents: number[] | null = null,
  ) {}

  get ahead(): boolean {
    return this.assumed !== null;
  }

  /** The drafts of the block's main chain (a tree's leaves come after it). */
  get chainLength(): number {
    if (this.parents === null) return this.tokens.length;
    const i = this.parents.findIndex((parent, index) => parent !== index - 1);
    return i < 0 ? this.parents.length : i;
  }
}

export type Kind = "committed" | "stale" | "discarded";

/**
 * What one verdict meant. After a commit the draft's context must hold committed[:keep]; with
 * `holds` it already holds everything the next block in flight assumed.
 */
export interface Outcome {
  kind: Kind;
  block: Block;
  tokens: number[];
  accepted: number;
  keep: number;
  holds: boolean;
  /** Blocks this verdict made stale (a discarded one counts itself). */
  dropped: number;
  finished: boolean;
  /** Committed; the replica ends the stream next: reopen elsewhere. */
  draining: boolean;
  verdict: Verdict | null;
}

function internal(message: string): StatusError {
  return new StatusError(Code.INTERNAL, message);
}

/** One generation's protocol state, across every stream it takes (Session and Generate). */
export class ClientSession {
  readonly promptLen: number;
  readonly committed: number[];
  roundNo = 0;
  finishReason = "";
  inflight: Block[] = [];

  constructor(promptIds: readonly number[], readonly params: GenerationParams, readonly fingerprint: string,
              readonly stopTokenIds: readonly number[], public maxContext: number, readonly maxK: number) {
    this.promptLen = promptIds.length;
    this.committed = [...promptIds];
  }

  get generated(): number[] {
    return this.committed.slice(this.promptLen);
  }

  get remaining(): number {
    return this.params.maxNewTokens - (this.committed.length - this.promptLen);
  }

  /** Drafts a fresh block may hold: a round commits up to k + 1 tokens the draft must still see. */
  get draftRoom(): number {
    return this.maxContext - this.committed.length - 1;
  }

  get validInflight(): Block[] {
    return this.inflight.filter((block) => !block.stale);
  }

  // ---- messages out --------------------------------------------------------------------

  /** The Open of a new Session stream: every committed token, the budget left, the next round. */
  open(): SessionRequest {
    this.inflight = [];
    return openRequest({
      promptIds: this.committed, sampling: this.params, mode: this.params.mode, fingerprint: this.fingerprint,
      maxNewTokens: this.remaining, stopTokenIds: this.stopTokenIds, firstRound: this.roundNo,
    });
  }

  /** A cloud-only Generate call continuing from every committed token. */
  generate(): GenerateRequest {
    this.inflight = [];
    return generateRequest({
      promptIds: this.committed, sampling: this.params, fingerprint: this.fingerprint,
      maxNewTokens: this.remaining, stopTokenIds: this.stopTokenIds, firstRound: this.roundNo,
    });
  }

  /** The most drafts a fresh block (round `roundNo`) may hold; 0: no room to draft. */
  freshLimit(): number {
    if (this.draftRoom < 1) return 0;
    return Math.min(this.maxK, this.draftRoom, Math.max(1, this.remaining - 1));
  }

  /** The most drafts a block sent ahead of the last valid one may hold; 0: none may go. */
  aheadLimit(): number {
    const valid = this.validInflight;
    const last = valid[valid.length - 1];
    if (last === undefined || last.parents !== null) return 0; // nothing goes ahead of a tree
    const pending = valid.reduce((sum, b) => sum + b.tokens.length + 1, 0);
    const room = this.maxContext - (this.committed.length + pending) - 1;
    const budget = this.remaining - pending;
    if (room < 1 || budget < 2) return 0;
    return Math.min(this.maxK, room, budget - 1);
  }

  nextAheadRound(): number {
    const valid = this.validInflight;
    return valid[valid.length - 1]!.roundNo + 1;
  }

  /** The Draft for `block`; from here on it is in flight. */
  draft(block: Block): SessionRequest {
    const q = this.params.mode === "exact" ? block.q : null;
    this.inflight.push(block);
    return draftRequest(block.roundNo, block.tokens, q, block.assumed, block.parents);
  }

  close(): SessionRequest {
    return CLOSE_REQUEST;
  }

  // ---- messages in ---------------------------------------------------------------------

  opened(message: Opened): void {
    this.maxContext = Math.min(this.maxContext, message.maxContext || this.maxContext);
  }

  /** Applies the verdict of the oldest block in flight. */
  verdict(message: Verdict): Outcome {
    const block = this.inflight.shift();
    if (block === undefined) throw internal(`verdict for round ${message.round} with no block in flight`);
    if (message.round !== block.roundNo) throw internal(`verdict for round ${message.round}, expected ${block.roundNo}`);
    const outcome = (kind: Kind, extra: Partial<Outcome> = {}): Outcome => ({
      kind, block, tokens: [], accepted: 0, keep: 0, holds: false, dropped: 0, finished: false, draining: false,
      verdict: null, ...extra,
    });
    if (block.stale) {
      if (!message.discarded) throw internal(`round ${block.roundNo} was verified, not discarded`);
      return outcome("stale");
    }
    if (message.discarded) {
      // The verifier saw otherwise: resynchronise on what is committed.
      return outcome("discarded", { keep: this.committed.length, dropped: 1 + this.dropInflight() });
    }
    return this.commit(block, message);
  }

  private commit(block: Block, message: Verdict): Outcome {
    const n = message.accepted;
    const token = message.nextToken;
    const path = block.parents !== null ? [...message.acceptedPath] : Array.from({ length: n }, (_, i) => i);
    if (path.some((i) => i < 0 || i >= block.tokens.length)) {
      throw internal(`round ${block.roundNo} accepted drafts [${path}] of ${block.tokens.length}`);
    }
    const newTokens = [...path.map((i) => block.tokens[i]!), token];
    const chain = path.filter((i) => i < block.chainLength).length; // drafts the draft's context holds
    const keep = this.committed.length + chain;
    this.committed.push(...newTokens);
    this.roundNo = block.roundNo + 1;
    if (message.finished) this.finishReason = finishName(message.finishReason);
    const head = this.inflight[0];
    const holds = n === block.chainLength && head !== undefined && !head.stale && head.assumed === token && !message.finished;
    const dropped = holds ? 0 : this.dropInflight();
    return {
      kind: "committed", block, tokens: newTokens, accepted: n, keep, holds, dropped, finished: message.finished,
      draining: message.draining && !message.finished, verdict: message,
    };
  }

  /** Marks every block in flight stale; returns how many were not already. */
  dropInflight(): number {
    const fresh = this.inflight.filter((block) => !block.stale);
    for (const block of fresh) block.stale = true;
    return fresh.length;
  }

  /** Commits the tokens of a Generate message (one round of draws each). */
  tokens(tokenIds: readonly number[], finish: string): void {
    this.committed.push(...tokenIds);
    this.roundNo += tokenIds.length;
    if (finish) this.finishReason = finish;
  }
}
