// The draft on the device: ONNX model, tokenizer, sampling, context lookup (see each module).
export { loadDraft, verifyGraph, DraftModel } from "./draft.js";
export type { LoadDraftOptions, OrtRuntime, OrtSession, OrtTensor, DraftStats } from "./draft.js";
export { Tokenizer, fingerprint, canonicalJson, vocabularySize, FINGERPRINT_SCHEME } from "./tokenizer.js";
export type { TokenizerSpec, DecodeOptions } from "./tokenizer.js";
export { nodeFiles, urlFiles, memoryFiles, sha256Hex } from "./files.js";
export type { DraftFiles } from "./files.js";
export { parseManifest } from "./manifest.js";
export type { DraftManifest } from "./manifest.js";
export { renderChat, chatTemplateOf } from "./chat.js";
export type { ChatMessage } from "./chat.js";
export { eosTokenIds, END_MARKERS } from "./eos.js";
export { LookupDraft, lookupNext, lookupConfig } from "./lookup.js";
export type { LookupConfig } from "./lookup.js";
export {
  SparseDist, PositionDraws, RoundDraws, roundDraws, probsFromLogits, truncateTopN, pointMass, mixPointMass, sample,
  positionKey, positionUniforms, positionExponentials, race, coupledToken, mix64, pairwiseSum,
} from "./sampling.js";
export type { Draws, SamplingParams } from "./sampling.js";
export { drawsFor, checkedTokenIds } from "./drafter.js";
export type { Drafter, DrawsSpec, ProposeOptions, Proposal } from "./drafter.js";
