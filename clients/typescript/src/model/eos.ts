/**
 * Which token ids end a generation (edge/eos.py's rule): generation_config.json's, config.json's
 * (and its text_config's), the tokenizer's eos token, and for chat models every special added
 * token that is a known end-of-text or end-of-turn marker.
 */

import { chatTemplateOf } from "./chat.js";
import type { DraftFiles } from "./files.js";
import type { TokenizerSpec } from "./tokenizer.js";

export const END_MARKERS = new Set([
  "<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
  "<end_of_turn>", "<eos>", "</s>", "<|return|>", "<|end_of_turn|>",
]);

async function readJson(files: DraftFiles, name: string): Promise<Record<string, unknown>> {
  const text = await files.text(name);
  if (!text) return {};
  try {
    const data = JSON.parse(text);
    return data && typeof data === "object" && !Array.isArray(data) ? data : {};
  } catch {
    return {};
  }
}

function ids(value: unknown): number[] {
  if (typeof value === "number" && Number.isInteger(value)) return [value];
  if (Array.isArray(value)) return value.filter((v) => typeof v === "number" && Number.isInteger(v));
  return [];
}

/** Every id that ends a generation of the draft whose files and tokenizer these are. */
export async function eosTokenIds(files: DraftFiles, spec: TokenizerSpec, vocabSize?: number): Promise<number[]> {
  const found: number[] = [];
  found.push(...ids((await readJson(files, "generation_config.json")).eos_token_id));
  const config = await readJson(files, "config.json");
  found.push(...ids(config.eos_token_id));
  const text = config.text_config as Record<string, unknown> | undefined;
  if (text && typeof text === "object") found.push(...ids(text.eos_token_id));
  let eos = (await readJson(files, "tokenizer_config.json")).eos_token as unknown;
  if (eos && typeof eos === "object") eos = (eos as { content?: unknown }).content;
  if (typeof eos === "string") {
    const added = spec.added_tokens?.find((t) => t.content === eos);
    const vocab = spec.model?.vocab;
    const id = added?.id ?? (vocab && !Array.isArray(vocab) ? vocab[eos] : undefined);
    if (typeof id === "number") found.push(id);
  }
  if ((await chatTemplateOf(files)) !== null) {
    const ends = (spec.added_tokens ?? []).filter((t) => t.special && END_MARKERS.has(t.content));
    found.push(...ends.map((t) => t.id).sort((a, b) => a - b));
  }
  return [...new Set(found)].filter((t) => t >= 0 && (vocabSize === undefined || t < vocabSize));
}
