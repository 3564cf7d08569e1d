/** @edgespec/client: speculative decoding with the draft on the device and the target in an edgespec cloud. */

export { EdgeClient, TextStream } from "./client.js";
export type { ClientDraft, ClientOptions, RequestOptions } from "./client.js";
export type { ChatMessage, Drafter, DrawsSpec, Proposal, ProposeOptions, TextCodec } from "./drafter.js";
export * from "./errors.js";
export { generationParams, MODES } from "./params.js";
export type { GenerationOptions, GenerationParams, Mode, SamplingParams } from "./params.js";
export { Planner, plannerConfig, DEFAULT_PLANNER_CONFIG } from "./planner.js";
export type { Decision, Path, PlannerConfig } from "./planner.js";
export { ClientSession, Block } from "./protocol.js";
export { connect, isWebSocketAddress } from "./transport/index.js";
export type { ConnectOptions, Transport } from "./transport/index.js";
export { RequestStats } from "./types.js";
export type { Result, RoundRecord, ServerInfo } from "./types.js";
