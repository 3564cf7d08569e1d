/**
 * A verifier in a few lines for the loop's tests: its "target" accepts drafts equal to
 * `target(context)` (the greedy rule), emits that token after the accepted ones, and honours
 * the budget, stop tokens, send-ahead and round numbers. Scripted faults: cut the stream after
 * `cutAfter` verdicts (with `cutCode`), or refuse the first Open with `refuse`.
 */

import { create } from "@bufbuild/protobuf";
import { Code, StatusError } from "../../src/errors.js";
import { FinishReason, InfoResponseSchema, SessionResponseSchema, type SessionRequest, type SessionResponse, VerifyMode } from "../../src/gen/edgespec/v1/speculative_pb.js";

export const VOCAB = 50;
export const STOP = VOCAB - 1;
/** The scripted target's next token: a function of the context alone. */
export const target = (context: readonly number[]): number => (context[context.length - 1]! * 7 + context.length * 3 + 1) % (VOCAB - 2) + 1;

export interface Script {
  cutAfter?: number;
  cutCode?: Code;
  draining?: boolean;
  refuse?: Code;
}

export class FakeVerifier {
  opens: Array<{ promptIds: number[]; firstRound: number; maxNewTokens: number }> = [];
  streams = 0;

  constructor(private readonly script: Script = {}) {}

  info() {
    return create(InfoResponseSchema, {
      modelId: "fake", tokenizerFingerprint: "fp", vocabSize: VOCAB, maxContext: 4096, maxK: 8, sendAhead: true,
      modes: [VerifyMode.GREEDY, VerifyMode.COUPLED], forwardMs: 1, decodeMs: 1, streamMs: 1,
    });
  }

  /** A Generate call's replies: the target's tokens after the prompt, `per` a message, within the budget. */
  generate(promptIds: readonly number[], maxNewTokens: number, per = 3): Array<{ tokenIds: number[]; finished: boolean; finishReason: FinishReason }> {
    const context = [...promptIds];
    const replies = [];
    while (context.length - promptIds.length < maxNewTokens) {
      const tokens: number[] = [];
      while (tokens.length < per && context.length - promptIds.length < maxNewTokens) {
        const token = target(context);
        context.push(token);
        tokens.push(token);
      }
      const finished = context.length - promptIds.length >= maxNewTokens;
      replies.push({ tokenIds: tokens, finished, finishReason: finished ? FinishReason.LENGTH : FinishReason.UNSPECIFIED });
    }
    return replies;
  }

  /** Plays one Session stream: takes requests as they come, returns the replies to send (or throws the status to end with). */
  session(): (request: SessionRequest) => SessionResponse[] {
    this.streams += 1;
    const stream = this.streams;
    let context: number[] = [];
    let generated = 0;
    let budget = 0;
    let expected = 0;
    let finished = false;
    let verdicts = 0;
    let last: { whole: boolean; token: number } | null = null;
    return (request) => {
      const kind = request.kind;
      if (kind.case === "open") {
        this.opens.push({ promptIds: [...kind.value.promptIds], firstRound: kind.value.firstRound, maxNewTokens: kind.value.maxNewTokens });
        if (this.script.refuse !== undefined && stream === 1) throw new StatusError(this.script.refuse, "scripted refusal");
        context = [...kind.value.promptIds];
        budget = kind.value.maxNewTokens;
        expected = kind.value.firstRound;
        return [create(SessionResponseSchema, { kind: { case: "opened", value: { sessionId: "s", maxK: 8, maxContext: 4096, maxNewTokens: budget } } })];
      }
      if (kind.case === "close") return [create(SessionResponseSchema, { kind: { case: "closed", value: { rounds: verdicts } } })];
      if (kind.case !== "draft") throw new StatusError(Code.FAILED_PRECONDITION, "no Open");
      const draft = kind.value;
      const verdict = (value: object) => create(SessionResponseSchema, { kind: { case: "verdict", value: { round: draft.round, batchSize: 1, verifyMs: 1, ...value } } });
      if (draft.ahead && !(draft.round === expected && last?.whole && last.token === draft.assumedToken && !finished)) {
        return [verdict({ discarded: true })];
      }
      if (draft.round !== expected) throw new StatusError(Code.FAILED_PRECONDITION, `round ${draft.round}, expected ${expected}`);
      const tokens: number[] = [];
      let accepted = 0;
      for (const d of draft.tokenIds) {
        if (d !== target([...context, ...tokens])) break;
        tokens.push(d);
        accepted += 1;
      }
      tokens.push(target([...context, ...tokens]));
      let finish = FinishReason.UNSPECIFIED;
      const stopAt = tokens.findIndex((t) => t === STOP);
      if (stopAt >= 0) {
        tokens.length = stopAt + 1;
        finish = FinishReason.STOP_TOKEN;
      }
      if (generated + tokens.length >= budget) {
        tokens.length = Math.min(tokens.length, budget - generated);
        finish = finish || FinishReason.LENGTH;
      }
      accepted = Math.min(accepted, tokens.length - 1);
      context.push(...tokens);
      generated += tokens.length;
      expected = draft.round + 1;
      finished = finish !== FinishReason.UNSPECIFIED;
      last = { whole: accepted === draft.tokenIds.length, token: tokens[tokens.length - 1]! };
      verdicts += 1;
      const cut = stream === 1 && verdicts === this.script.cutAfter && !finished;
      const reply = verdict({ accepted, nextToken: tokens[tokens.length - 1], finished, finishReason: finish, draining: cut && !!this.script.draining });
      if (cut) return [reply, null as unknown as SessionResponse];
      return [reply];
    };
  }
}
