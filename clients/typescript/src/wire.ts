/**
 * The one codec between the SDK's types and the wire contract (proto/, generated into src/gen):
 * enum numbers, the meaning of a zero field and a message's byte count are written here only,
 * as edge/wire.py does for Python.
 */

import { create, toBinary, fromBinary } from "@bufbuild/protobuf";
import {
  FinishReason, VerifyMode,
  type GenerateRequest, GenerateRequestSchema, type GenerateResponse, GenerateResponseSchema,
  type InfoResponse, InfoResponseSchema, InfoRequestSchema,
  type SessionRequest, SessionRequestSchema, type SessionResponse, SessionResponseSchema,
  SamplingParamsSchema, SparseDistributionSchema,
} from "./gen/edgespec/v1/speculative_pb.js";
import type { Mode, SamplingParams } from "./params.js";
import type { ServerInfo } from "./types.js";

export {
  SessionRequestSchema, SessionResponseSchema, GenerateRequestSchema, GenerateResponseSchema,
  InfoRequestSchema, InfoResponseSchema,
};
export type { SessionRequest, SessionResponse, GenerateRequest, GenerateResponse, InfoResponse };

export const MODE_TO_WIRE: Record<Mode, VerifyMode> = {
  greedy: VerifyMode.GREEDY,
  exact: VerifyMode.EXACT,
  token: VerifyMode.TOKEN,
  coupled: VerifyMode.COUPLED,
};
const MODE_FROM_WIRE = new Map<number, Mode>(Object.entries(MODE_TO_WIRE).map(([mode, n]) => [n, mode as Mode]));
const FINISH_NAMES = new Map<number, string>([
  [FinishReason.STOP_TOKEN, "stop_token"],
  [FinishReason.LENGTH, "length"],
  [FinishReason.CONTEXT, "context"],
]);
/** Bytes before every gRPC message: flag + 4-byte length (counted for both transports, as the Python SDK does). */
export const GRPC_FRAME_HEADER = 5;

/** A sparse q: the draft's distribution restricted to its support (exact mode sends it). */
export interface SparseDist {
  tokenIds: ArrayLike<number>;
  probs: ArrayLike<number>;
}

/** A wire FinishReason as the SDK reports it ("stop_token", "length", "context"). */
export function finishName(reason: number): string {
  return FINISH_NAMES.get(reason) ?? "unknown";
}

function samplingToWire(sampling: SamplingParams) {
  return create(SamplingParamsSchema, { temperature: sampling.temperature, topK: sampling.topK, topP: sampling.topP, seed: sampling.seed });
}

export interface OpenFields {
  promptIds: readonly number[];
  sampling: SamplingParams;
  mode: Mode;
  fingerprint: string;
  maxNewTokens: number;
  stopTokenIds: readonly number[];
  firstRound: number;
}

export function openRequest(o: OpenFields): SessionRequest {
  return create(SessionRequestSchema, {
    kind: {
      case: "open",
      value: {
        promptIds: [...o.promptIds], sampling: samplingToWire(o.sampling), mode: MODE_TO_WIRE[o.mode],
        tokenizerFingerprint: o.fingerprint, maxNewTokens: o.maxNewTokens, stopTokenIds: [...o.stopTokenIds],
        firstRound: o.firstRound,
      },
    },
  });
}

/**
 * A Draft: `q` (exact mode) one sparse q per drafted token; `assumedToken` a block sent ahead,
 * valid if the round before accepts all its drafts and emits that bonus token; `parents` a tree.
 */
export function draftRequest(round: number, tokens: readonly number[], q: readonly SparseDist[] | null,
                             assumedToken: number | null, parents: readonly number[] | null): SessionRequest {
  return create(SessionRequestSchema, {
    kind: {
      case: "draft",
      value: {
        round, tokenIds: [...tokens], parents: parents ? [...parents] : [],
        ahead: assumedToken !== null, assumedToken: assumedToken ?? 0,
        q: (q ?? []).map((d) => create(SparseDistributionSchema, { tokenIds: Array.from(d.tokenIds), probs: Array.from(d.probs) })),
      },
    },
  });
}

export const CLOSE_REQUEST: SessionRequest = create(SessionRequestSchema, { kind: { case: "close", value: {} } });

export function generateRequest(o: Omit<OpenFields, "mode">): GenerateRequest {
  return create(GenerateRequestSchema, {
    promptIds: [...o.promptIds], sampling: samplingToWire(o.sampling), tokenizerFingerprint: o.fingerprint,
    maxNewTokens: o.maxNewTokens, stopTokenIds: [...o.stopTokenIds], firstRound: o.firstRound,
  });
}

export const encodeSessionRequest = (m: SessionRequest): Uint8Array => toBinary(SessionRequestSchema, m);
export const decodeSessionRequest = (b: Uint8Array): SessionRequest => fromBinary(SessionRequestSchema, b);
export const encodeSessionResponse = (m: SessionResponse): Uint8Array => toBinary(SessionResponseSchema, m);
export const decodeSessionResponse = (b: Uint8Array): SessionResponse => fromBinary(SessionResponseSchema, b);
export const encodeGenerateRequest = (m: GenerateRequest): Uint8Array => toBinary(GenerateRequestSchema, m);
export const decodeGenerateResponse = (b: Uint8Array): GenerateResponse => fromBinary(GenerateResponseSchema, b);
export const encodeInfoRequest = (): Uint8Array => toBinary(InfoRequestSchema, create(InfoRequestSchema));
export const decodeInfoResponse = (b: Uint8Array): InfoResponse => fromBinary(InfoResponseSchema, b);

export function serverInfo(reply: InfoResponse): ServerInfo {
  return {
    modelId: reply.modelId, tokenizerFingerprint: reply.tokenizerFingerprint, vocabSize: reply.vocabSize,
    maxContext: reply.maxContext, maxK: reply.maxK, maxNewTokens: reply.maxNewTokens,
    modes: reply.modes.map((m) => MODE_FROM_WIRE.get(m) ?? String(m)), version: reply.version,
    forwardMs: reply.forwardMs, decodeMs: reply.decodeMs, streamMs: reply.streamMs,
    maxSessions: reply.maxSessions, freeSessions: reply.freeSessions, sessionIdleTimeoutS: reply.sessionIdleTimeoutS,
    firstMessageTimeoutS: reply.firstMessageTimeoutS, defaultMaxNewTokens: reply.defaultMaxNewTokens,
    maxMessageBytes: Number(reply.maxMessageBytes), maxQEntries: reply.maxQEntries, authRequired: reply.authRequired,
    sendAhead: reply.sendAhead, maxTreeTokens: reply.maxTreeTokens, replicaId: reply.replicaId,
  };
}
