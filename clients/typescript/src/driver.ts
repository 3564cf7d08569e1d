/**
 * The device's generation loop (edge/driver.py): it moves the protocol's messages
 * (protocol.ts's ClientSession) over a transport, drafts blocks (drafting.ts), tells the planner
 * what it measured (`observe`) and asks it which path, k and depth (`decide`).
 *
 * `chunks` runs segments until the generation finishes. A speculative segment is one Session stream:
 * 1. Open (with every committed token) and, right behind it, the first block;
 * 2. keep up to `depth` blocks in flight: each after the first is drafted ahead, assuming the
 *    block before it is accepted whole with the draft's own guess as its bonus token;
 * 3. apply each verdict: a commit yields its tokens; blocks behind it stay valid only if it is
 *    exactly what they assumed, else they are stale (their verdicts come back "discarded"), the
 *    draft rolls back to the committed tokens and a fresh block goes out for the next round;
 * 4. stop when finished or the planner switches path; move when the verdict says draining.
 * A cloud-only segment is one Generate stream. A broken stream is resumed from every committed
 * token, round numbering continued (Retries decides how often). The caller's AbortSignal cancels
 * the stream in flight and ends the generation with CancelledError.
 */

import type { Verdict } from "./gen/edgespec/v1/speculative_pb.js";
import type { Drafter } from "./drafter.js";
import { BlockDrafter } from "./drafting.js";
import { CancelledError, Code, ReplyTimeout, StatusError } from "./errors.js";
import { type GenerationParams, pathMode, servedMode } from "./params.js";
import { type Decision, type Path, Planner } from "./planner.js";
import { type Block, ClientSession, type Outcome } from "./protocol.js";
import { ReplicaMoved, Retries } from "./retries.js";
import { Shadow } from "./shadow.js";
import { LookupDraft } from "./model/index.js";
import type { SessionStream, Transport } from "./transport/types.js";
import { RequestStats, type RoundRecord, type ServerInfo } from "./types.js";
import { GRPC_FRAME_HEADER, type SessionRequest, type SessionResponse, encodeSessionRequest, finishName } from "./wire.js";

export type Clock = () => number; // seconds
/** While streaming cloud-only: how often the round trip is probed (an Info call), as edge/driver.py. */
export const RTT_PROBE_INTERVAL_S = 0.5;
export const defaultClock: Clock = () => performance.now() / 1000;

export interface GenerationOptions {
  timeoutS: number;
  maxRetries: number;
  planner?: Planner;
  signal?: AbortSignal;
  clock?: Clock;
}

/** The lookup-only drafter (src/model's LookupDraft) over `drafter`, which lends it its manifest and tokenizer. */
function lookupOnly(drafter: Drafter): Drafter {
  if (!("manifest" in drafter)) throw new TypeError("lookup 'only' needs the ONNX draft (loadDraft): it lends its manifest and tokenizer");
  const lookup = new LookupDraft(drafter as unknown as ConstructorParameters<typeof LookupDraft>[0]);
  return Object.assign(lookup, { tokenizerFingerprint: drafter.tokenizerFingerprint, maxPositions: drafter.maxPositions }) as unknown as Drafter;
}

function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, seconds * 1000);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** One generation request; iterate `chunks()` for the tokens as they are committed. */
export class Generation {
  readonly session: ClientSession;
  readonly planner: Planner;
  readonly stats: RequestStats;
  readonly rounds: RoundRecord[] = [];
  readonly segments: Array<[string, number]> = [];
  decision!: Decision;
  private readonly drafting: BlockDrafter;
  private readonly retries: Retries;
  private readonly params: GenerationParams;
  private readonly clock: Clock;
  private readonly sendAhead: number | "auto";
  private readonly tree: number;
  private lastVerdictAt = 0;
  private movedAt: number | null = null;
  private active: { cancel(): void } | null = null;

  private readonly drafter: Drafter;

  constructor(private readonly transport: Transport, drafter: Drafter, promptIds: readonly number[],
              params: GenerationParams, private readonly info: ServerInfo, private readonly options: GenerationOptions) {
    this.params = params = servedMode(params, info.modes); // an older server: exact instead of coupled
    if (params.lookup === "only") drafter = lookupOnly(drafter); // no draft model: every draft from the context
    this.drafter = drafter;
    const stop = params.stopTokenIds ?? drafter.eosTokenIds;
    // The draft sees at most this many positions; past it the cloud finishes alone.
    const room = params.lookup === "only" ? info.maxContext : Math.min(info.maxContext, drafter.maxPositions);
    this.session = new ClientSession(promptIds, params, drafter.tokenizerFingerprint, stop, room, info.maxK);
    this.planner = options.planner ?? new Planner(pathMode(params));
    this.sendAhead = info.sendAhead ? params.sendAhead : 1;
    this.tree = params.mode === "greedy" ? params.tree : 0;
    this.clock = options.clock ?? defaultClock;
    this.drafting = new BlockDrafter(drafter, params, this.clock);
    this.retries = new Retries(options.maxRetries, this.clock);
    this.stats = new RequestStats();
    this.stats.seed = params.mode === "greedy" ? null : params.seed;
  }

  get generated(): number[] {
    return this.session.generated;
  }

  get finishReason(): string {
    return this.session.finishReason;
  }

  // ---- the loop over segments ------------------------------------------------------------

  async *chunks(): AsyncGenerator<number[]> {
    const started = this.clock();
    const { session, planner, params } = this;
    const signal = this.options.signal;
    const abort = () => this.active?.cancel();
    signal?.addEventListener("abort", abort);
    planner.observe({ kind: "start", maxNewTokens: params.maxNewTokens, maxK: this.info.maxK, k: params.k, sendAhead: this.sendAhead });
    this.decision = planner.decide(null, params.maxNewTokens);
    let path: Path = this.decision.path;
    try {
      while (!session.finishReason) {
        this.checkAborted();
        if (path === "speculative" && session.draftRoom < 1) path = "cloud_only"; // the draft's context is full
        planner.observe({ kind: "segment", path });
        try {
          const segment = path === "speculative" ? this.speculativeSegment() : this.cloudSegment();
          for await (const tokens of segment) {
            this.progress(started, path, tokens);
            yield tokens;
          }
        } catch (error) {
          this.checkAborted();
          if (!(error instanceof StatusError || error instanceof ReplyTimeout)) throw error;
          await this.recover(error); // throws the typed error when giving up
          continue; // the same path again, from every committed token
        }
        if (!session.finishReason && (path === "cloud_only" || session.draftRoom >= 1)) {
          path = path === "speculative" ? "cloud_only" : "speculative";
          this.stats.switches += 1;
        }
      }
    } finally {
      signal?.removeEventListener("abort", abort);
      this.active?.cancel();
      this.stats.wallS = this.clock() - started;
    }
  }

  private checkAborted(): void {
    if (this.options.signal?.aborted) throw new CancelledError("the generation was cancelled (AbortSignal)");
  }

  private progress(started: number, path: Path, tokens: number[]): void {
    if (tokens.length === 0) return;
    const now = this.clock();
    if (!this.stats.firstTokenS) this.stats.firstTokenS = now - started;
    this.retries.progress();
    if (this.movedAt !== null) this.movedAt = null;
    const last = this.segments[this.segments.length - 1];
    if (last && last[0] === path) last[1] += tokens.length;
    else this.segments.push([path, tokens.length]);
  }

  /** Counts the break, reroutes where another replica should take the session, and waits. */
  private async recover(error: StatusError | ReplyTimeout): Promise<void> {
    const retry = this.retries.decide(error);
    if (retry.reroute) this.transport.reconnect();
    if (retry.cause === "moved") {
      this.stats.moves += 1;
      this.movedAt = this.clock();
    } else if (retry.cause === "failure") {
      this.stats.resumes += 1;
    }
    await sleep(retry.delayS, this.options.signal);
  }

  // ---- speculation over one Session stream -----------------------------------------------

  private send(stream: SessionStream, message: SessionRequest): void {
    const frame = encodeSessionRequest(message);
    this.stats.bytesSent += frame.byteLength + GRPC_FRAME_HEADER;
    stream.send(frame);
  }

  private async receive<K extends "opened" | "verdict">(stream: SessionStream, kind: K) {
    const message: SessionResponse = await stream.receive(this.options.timeoutS);
    if (message.kind.case !== kind) throw new StatusError(Code.INTERNAL, `expected ${kind}, the server sent ${message.kind.case ?? "nothing"}`);
    return message.kind.value as Extract<SessionResponse["kind"], { case: K }>["value"];
  }

  private async *speculativeSegment(): AsyncGenerator<number[]> {
    const { session, planner } = this;
    const stream = this.transport.session();
    this.active = stream;
    let closing = false;
    const probe = this.probe(false);
    try {
      // Step 1: Open, and the first block right behind it (its drafting overlaps the Open's trip).
      this.send(stream, session.open());
      this.drafting.sync(session.committed);
      this.lastVerdictAt = this.clock();
      await this.sendFresh(stream, true);
      const opened = await this.receive(stream, "opened");
      session.opened(opened);
      this.stats.replicaIds.push(opened.replicaId);
      while (session.inflight.length > 0) {
        // Step 2: keep the pipeline full with blocks drafted ahead.
        await this.fill(stream);
        // Step 3: apply the next verdict.
        const verdict = await this.receive(stream, "verdict");
        const outcome = session.verdict(verdict);
        if (outcome.kind === "stale") continue; // sent on an assumption that failed: "discarded"
        if (outcome.kind === "discarded") {
          this.dropped(outcome);
          await this.sendFresh(stream);
          continue;
        }
        this.account(outcome, verdict);
        yield outcome.tokens;
        // Step 4: move, stop, or go on.
        if (outcome.draining) throw new ReplicaMoved(); // committed; the replica ends the stream
        if (outcome.finished) {
          closing = this.close(stream);
          return;
        }
        this.decision = planner.decide("speculative", session.remaining);
        if (this.decision.path !== "speculative") {
          closing = this.close(stream);
          return;
        }
        if (session.validInflight.length === 0 && !(await this.sendFresh(stream))) return; // no room: the cloud finishes
      }
    } finally {
      probe.stop();
      if (!closing) stream.cancel();
      this.active = null;
    }
  }

  /**
   * Ends the session the polite way: Close, then the server's last messages (verdicts of blocks
   * still in flight, Closed) are read in the background until the stream ends, so the server
   * finishes a stream its client still holds instead of one it cancelled.
   */
  private close(stream: SessionStream): boolean {
    this.send(stream, this.session.close());
    stream.doneWriting();
    const timeoutS = this.options.timeoutS;
    void (async () => {
      try {
        for (;;) await stream.receive(timeoutS);
      } catch {
        // (the end of the stream, whatever its status)
      } finally {
        stream.cancel();
      }
    })();
    return true;
  }

  /** Drafts and sends a block for the next round; false when there is no room to draft. */
  private async sendFresh(stream: SessionStream, prefilled = false): Promise<boolean> {
    const limit = this.session.freshLimit();
    if (limit < 1) return false;
    const k = Math.max(1, Math.min(this.decision.k, limit));
    const leaves = Math.max(0, Math.min(this.tree, this.info.maxTreeTokens - k)); // runner-up leaves (greedy)
    const block = await this.drafting.fresh(this.session.roundNo, k, leaves, prefilled);
    this.sendBlock(stream, block);
    return true;
  }

  private sendBlock(stream: SessionStream, block: Block): void {
    block.sentAt = this.clock();
    this.send(stream, this.session.draft(block));
  }

  private async fill(stream: SessionStream): Promise<void> {
    const depth = this.sendAhead === "auto" ? this.decision.depth : this.sendAhead;
    while (this.session.validInflight.length < depth) {
      const limit = this.session.aheadLimit();
      if (limit < 1) return;
      const block = await this.drafting.ahead(this.session.nextAheadRound(), Math.max(1, Math.min(this.decision.k, limit)));
      this.sendBlock(stream, block);
    }
  }

  /** Blocks sent ahead went stale: the draft forgets them. */
  private dropped(outcome: Outcome): void {
    this.stats.discardedBlocks += outcome.dropped;
    if (outcome.kind === "discarded" || !outcome.holds) {
      // The draft's context holds the chain: keep its accepted part, then what else came.
      this.drafter.rollbackTo(outcome.keep);
      this.drafter.append(this.session.committed.slice(outcome.keep));
    }
  }

  /** A committed round: stats, the round's record, what the planner learns, the draft. */
  private account(outcome: Outcome, verdict: Verdict): void {
    const now = this.clock();
    const block = outcome.block;
    const k = block.chainLength;
    const n = outcome.accepted;
    const waitMs = (now - Math.max(block.sentAt, this.lastVerdictAt)) * 1000;
    const wallMs = (now - this.lastVerdictAt) * 1000;
    this.lastVerdictAt = now;
    this.stats.recordRound(k, n, outcome.tokens.length);
    this.stats.draftS += block.draftMs / 1000;
    this.stats.waitS += waitMs / 1000;
    if (block.ahead) this.stats.aheadHits += 1;
    this.rounds.push({ k, accepted: Math.min(n, k), nextToken: verdict.nextToken, draftMs: block.draftMs, waitMs, batchSize: verdict.batchSize, verifyMs: verdict.verifyMs });
    // A block sent ahead waited behind its predecessor: its wait is no round trip.
    this.planner.observe({
      kind: "round", k, accepted: n, tokens: outcome.tokens.length, wallMs, waitMs: block.ahead ? null : waitMs,
      forwardMs: verdict.verifyMs, draftMs: block.prefilled ? null : block.draftMs,
    });
    this.dropped(outcome);
  }

  // ---- cloud-only over one Generate stream -----------------------------------------------

  private async *cloudSegment(): AsyncGenerator<number[]> {
    const { session, planner, stats } = this;
    const call = this.transport.generate(session.generate());
    this.active = call;
    const probe = this.probe(true);
    const shadow = planner.mode === "auto" && Shadow.supported(this.drafter)
      ? new Shadow(this.drafter, planner, session.committed, this.drafting.shadowSettings(), this.clock) : null;
    try {
      const called = this.clock();
      let firstAt: number | null = null;
      let sinceFirst = 0;
      for (;;) {
        const reply = await call.next(this.options.timeoutS);
        if (reply === null) throw new StatusError(Code.UNAVAILABLE, "the Generate stream ended before its last token");
        const now = this.clock();
        const tokens = [...reply.tokenIds];
        if (firstAt === null) {
          firstAt = now;
          planner.observe({ kind: "first_token", ms: (now - called) * 1000 });
        } else {
          sinceFirst += tokens.length;
          planner.observe({ kind: "streamed", ms: (now - firstAt) * 1000, tokens: sinceFirst });
        }
        const finish = reply.finished ? finishName(reply.finishReason) : "";
        session.tokens(tokens, finish);
        stats.generated += tokens.length;
        stats.targetCalls += tokens.length;
        stats.cloudOnlyTokens += tokens.length;
        yield tokens;
        if (finish) return;
        if (reply.draining) throw new ReplicaMoved();
        const probs = reply.tokenProbs.length === tokens.length && tokens.length ? [...reply.tokenProbs] : null;
        shadow?.observe(tokens, session.committed, session.maxContext, probs);
        if (session.draftRoom > 1) {
          this.decision = planner.decide("cloud_only", session.remaining);
          if (this.decision.path !== "cloud_only") return; // cancelled: tokens not received are not committed
        }
      }
    } finally {
      probe.stop();
      call.cancel();
      this.active = null;
      await shadow?.finish(session.committed);
    }
  }

  /**
   * Info round trips beside a segment, where the planner chooses the path: beside a stream, from
   * its start and every RTT_PROBE_INTERVAL_S, the round trip and the replica's forward and stream
   * figures (what no stream measures); beside a speculative segment, once, the replica's stream
   * figures (rounds measure the round trip and the forward themselves).
   */
  private probe(streaming: boolean): { stop(): void } {
    let stopped = this.planner.mode !== "auto";
    void (async () => {
      while (!stopped) {
        try {
          const started = this.clock();
          const reply = await this.transport.info(this.options.timeoutS);
          const rtt = (this.clock() - started) * 1000;
          if (stopped) return;
          this.planner.observe({
            kind: "info", forwardMs: streaming ? reply.forwardMs : 0, decodeMs: reply.decodeMs, streamMs: reply.streamMs,
            rttMs: streaming ? rtt : null,
          });
        } catch {
          // (a failed probe says nothing about the segment; the segment reports its own errors)
        }
        if (!streaming) return;
        await sleep(RTT_PROBE_INTERVAL_S);
      }
    })();
    return { stop: () => void (stopped = true) };
  }
}
