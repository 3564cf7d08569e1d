/**
 * The draft's tokenizer: byte-level BPE read from `tokenizer.json` (the kind both edgespec drafts
 * use: GPT-2's byte-to-unicode alphabet, its split regex, ranked merges, added tokens split out
 * first), encoding and decoding as Hugging Face `tokenizers` does, and the tok1 fingerprint the
 * verifier compares (docs/protocol.md "Tokenizer fingerprint", edge/tokenizer.py).
 *
 * No dependency: it runs the same in Node, browsers and React Native.
 */

import { sha256Hex } from "./files.js";

export const FINGERPRINT_SCHEME = "tok1";

/** tokenizer.json as parsed (only the parts read here are typed). */
export interface TokenizerSpec {
  model?: {
    type?: string;
    vocab?: Record<string, number> | [string, number][];
    merges?: (string | [string, string])[];
    continuing_subword_prefix?: string | null;
    end_of_word_suffix?: string | null;
    byte_fallback?: boolean;
    ignore_merges?: boolean;
    [key: string]: unknown;
  } | null;
  added_tokens?: { id: number; content: string; special?: boolean; [key: string]: unknown }[];
  normalizer?: unknown;
  pre_tokenizer?: unknown;
  decoder?: unknown;
  [key: string]: unknown;
}

// ---- the tok1 fingerprint ------------------------------------------------------------------

/** RFC 8785 (JSON Canonicalization Scheme): what edge/tokenizer.py's canonical_json writes. */
export function canonicalJson(value: unknown): string {
  if (value === null || value === undefined) return "null";
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new Error("JSON has no NaN or infinity");
    return Object.is(value, -0) ? "0" : String(value); // String() is ECMAScript's Number::toString
  }
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) return "[" + value.map(canonicalJson).join(",") + "]";
  if (typeof value === "object") {
    const record = value as Record<string, unknown>;
    const keys = Object.keys(record).sort(); // JS strings compare by UTF-16 code units, as RFC 8785 sorts
    return "{" + keys.map((k) => JSON.stringify(k) + ":" + canonicalJson(record[k])).join(",") + "}";
  }
  throw new TypeError(`not JSON: ${typeof value}`);
}

/** Distinct ids of the model's vocabulary and the added tokens. */
export function vocabularySize(spec: TokenizerSpec): number {
  const ids = new Set<number>();
  const vocab = spec.model?.vocab;
  if (Array.isArray(vocab)) vocab.forEach((_, i) => ids.add(i));
  else if (vocab && typeof vocab === "object") Object.values(vocab).forEach((id) => ids.add(id));
  for (const token of spec.added_tokens ?? []) ids.add(token.id);
  return ids.size;
}

/** The parts of a tokenizer.json that decide its ids, in the form tok1 hashes. */
function fingerprintedParts(spec: TokenizerSpec): unknown {
  let model: unknown = spec.model ?? null;
  if (spec.model && Array.isArray(spec.model.merges)) {
    const merges = spec.model.merges.map((m) => (typeof m === "string" ? splitFirstSpace(m) : m));
    model = { ...spec.model, merges };
  }
  return {
    model,
    added_tokens: (spec.added_tokens ?? []).map((t) => ({ id: t.id, content: t.content, special: Boolean(t.special) })),
    normalizer: spec.normalizer ?? null,
    pre_tokenizer: spec.pre_tokenizer ?? null,
  };
}

function splitFirstSpace(merge: string): string[] {
  const at = merge.indexOf(" ");
  return at < 0 ? [merge] : [merge.slice(0, at), merge.slice(at + 1)];
}

/** tok1-<model type>-<vocabulary size>-<16 hex>: what the verifier's Info.tokenizer_fingerprint holds. */
export async function fingerprint(spec: TokenizerSpec, sha256: (data: Uint8Array) => Promise<string> = sha256Hex): Promise<string> {
  const digest = (await sha256(new TextEncoder().encode(canonicalJson(fingerprintedParts(spec))))).slice(0, 16);
  const type = String(spec.model?.type ?? "unknown").toLowerCase();
  return `${FINGERPRINT_SCHEME}-${type}-${vocabularySize(spec)}-${digest}`;
}

// ---- byte-level BPE ------------------------------------------------------------------------

/** GPT-2's reversible map from bytes to printable characters (the byte-level alphabet). */
function bytesToUnicode(): string[] {
  const printable: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) printable.push(b);
  for (let b = 0xa1; b <= 0xac; b++) printable.push(b);
  for (let b = 0xae; b <= 0xff; b++) printable.push(b);
  const table = new Array<string>(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    table[b] = String.fromCharCode(printable.includes(b) ? b : 256 + extra++);
  }
  return table;
}

const BYTE_CHARS = bytesToUnicode();
const CHAR_BYTES = new Map(BYTE_CHARS.map((c, b) => [c, b]));

// Oniguruma's \s (what tokenizers' regex uses) is Unicode White_Space: JS's \s adds U+FEFF and
// lacks U+0085, so the class is spelled out.
const WS = "\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
/** GPT-2's split (ByteLevel's use_regex). */
const BYTE_LEVEL_SPLIT = new RegExp(
  `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^${WS}\\p{L}\\p{N}]+|[${WS}]+(?![^${WS}])|[${WS}]+`,
  "gu",
);

interface ByteLevelOptions {
  addPrefixSpace: boolean;
  useRegex: boolean;
}

function byteLevelOptions(preTokenizer: unknown): ByteLevelOptions {
  const pre = preTokenizer as { type?: string; add_prefix_space?: boolean; use_regex?: boolean } | null;
  if (!pre || pre.type !== "ByteLevel") {
    throw new Error(`tokenizer.json: only the ByteLevel pre-tokenizer is supported, got ${JSON.stringify(pre?.type ?? null)}`);
  }
  return { addPrefixSpace: Boolean(pre.add_prefix_space), useRegex: pre.use_regex !== false };
}

export interface DecodeOptions {
  /** Leave out every added token marked special (default true, as the Python SDK decodes). */
  skipSpecialTokens?: boolean;
}

export class Tokenizer {
  readonly spec: TokenizerSpec;
  readonly vocab = new Map<string, number>();
  readonly idToToken = new Map<number, string>();
  readonly specialIds = new Set<number>();
  /** "a b" -> rank of that merge. */
  private readonly ranks = new Map<string, number>();
  private readonly added: { content: string; id: number }[];
  private readonly options: ByteLevelOptions;
  private readonly prefix: string;
  private readonly suffix: string;
  private readonly cache = new Map<string, number[]>();

  constructor(spec: TokenizerSpec) {
    this.spec = spec;
    const model = spec.model;
    if (!model || model.type !== "BPE" || Array.isArray(model.vocab) || !model.vocab || !Array.isArray(model.merges)) {
      throw new Error(`tokenizer.json: only BPE models (a vocab object and merges) are supported, got ${JSON.stringify(model?.type ?? null)}`);
    }
    if (spec.normalizer !== null && spec.normalizer !== undefined) {
      throw new Error("tokenizer.json: a normalizer is not supported (byte-level BPE has none)");
    }
    this.options = byteLevelOptions(spec.pre_tokenizer);
    for (const [token, id] of Object.entries(model.vocab)) {
      this.vocab.set(token, id);
      this.idToToken.set(id, token);
    }
    model.merges.forEach((merge, rank) => {
      const [a, b] = typeof merge === "string" ? splitFirstSpace(merge) : merge;
      const key = `${a} ${b}`;
      if (!this.ranks.has(key)) this.ranks.set(key, rank);
    });
    this.prefix = model.continuing_subword_prefix ?? "";
    this.suffix = model.end_of_word_suffix ?? "";
    this.added = (spec.added_tokens ?? []).map((t) => ({ content: t.content, id: t.id }));
    for (const token of spec.added_tokens ?? []) {
      this.idToToken.set(token.id, token.content);
      if (!this.vocab.has(token.content)) this.vocab.set(token.content, token.id);
      if (token.special) this.specialIds.add(token.id);
    }
  }

  static fromJSON(text: string): Tokenizer {
    return new Tokenizer(JSON.parse(text) as TokenizerSpec);
  }

  /** Distinct ids of the vocabulary and the added tokens (tokenizers' get_vocab_size(True)). */
  get vocabSize(): number {
    return vocabularySize(this.spec);
  }

  /** The tok1 fingerprint (see `fingerprint`). */
  fingerprint(sha256?: (data: Uint8Array) => Promise<string>): Promise<string> {
    return fingerprint(this.spec, sha256);
  }

  tokenToId(token: string): number | undefined {
    return this.vocab.get(token);
  }

  /** Token ids of `text`, as `Tokenizer.encode(text).ids` in Python (no special tokens added). */
  encode(text: string): number[] {
    const ids: number[] = [];
    for (const [piece, addedId] of this.splitAdded(text)) {
      if (addedId !== undefined) ids.push(addedId);
      else for (const word of this.preTokenize(piece)) ids.push(...this.bpe(word));
    }
    return ids;
  }

  /** Text of `ids`: byte-level decoding, invalid UTF-8 replaced by U+FFFD (as Rust's from_utf8_lossy). */
  decode(ids: readonly number[], options: DecodeOptions = {}): string {
    const skip = options.skipSpecialTokens ?? true;
    const bytes: number[] = [];
    for (const id of ids) {
      if (skip && this.specialIds.has(id)) continue;
      const token = this.idToToken.get(id);
      if (token === undefined) continue;
      const mapped: number[] = [];
      let whole = true;
      for (const char of token) {
        const b = CHAR_BYTES.get(char);
        if (b === undefined) {
          whole = false;
          break;
        }
        mapped.push(b);
      }
      // A token outside the byte alphabet (an added token's text) decodes to its own UTF-8.
      bytes.push(...(whole ? mapped : new TextEncoder().encode(token)));
    }
    return new TextDecoder("utf-8", { fatal: false }).decode(new Uint8Array(bytes));
  }

  /** `text` cut at the added tokens (leftmost, longest first): [piece, id of the added token or undefined]. */
  private splitAdded(text: string): [string, number | undefined][] {
    const out: [string, number | undefined][] = [];
    let at = 0;
    while (at < text.length) {
      let best: { start: number; content: string; id: number } | undefined;
      for (const token of this.added) {
        if (!token.content) continue;
        const start = text.indexOf(token.content, at);
        if (start < 0) continue;
        if (!best || start < best.start || (start === best.start && token.content.length > best.content.length)) {
          best = { start, content: token.content, id: token.id };
        }
      }
      if (!best) {
        out.push([text.slice(at), undefined]);
        break;
      }
      if (best.start > at) out.push([text.slice(at, best.start), undefined]);
      out.push([best.content, best.id]);
      at = best.start + best.content.length;
    }
    return out;
  }

  /** ByteLevel pre-tokenization: the regex's pieces, each as byte-level characters. */
  private preTokenize(text: string): string[] {
    if (this.options.addPrefixSpace && !text.startsWith(" ")) text = " " + text;
    const pieces = this.options.useRegex ? text.match(BYTE_LEVEL_SPLIT) ?? [] : [text];
    const encoder = new TextEncoder();
    return pieces.map((piece) => Array.from(encoder.encode(piece), (b) => BYTE_CHARS[b]).join(""));
  }

  /** One word's ids: merges applied lowest rank first, leftmost first among equal ranks (tokenizers' BPE). */
  private bpe(word: string): number[] {
    const cached = this.cache.get(word);
    if (cached) return cached;
    const chars = Array.from(word);
    let symbols = chars.map((c, i) => (i > 0 ? this.prefix : "") + c + (i === chars.length - 1 ? this.suffix : ""));
    symbols = symbols.filter((s) => this.vocab.has(s)); // no unk token: tokenizers drops what is not in the vocabulary
    for (;;) {
      let bestRank = Infinity;
      let bestAt = -1;
      for (let i = 0; i + 1 < symbols.length; i++) {
        const rank = this.ranks.get(`${symbols[i]} ${symbols[i + 1]}`);
        if (rank !== undefined && rank < bestRank) {
          bestRank = rank;
          bestAt = i;
        }
      }
      if (bestAt < 0) break;
      // (the right symbol's continuing-subword prefix goes: the merged token carries the left one's)
      const right = symbols[bestAt + 1];
      const merged = symbols[bestAt] + (this.prefix && right.startsWith(this.prefix) ? right.slice(this.prefix.length) : right);
      if (!this.vocab.has(merged)) break;
      symbols.splice(bestAt, 2, merged);
    }
    const ids = symbols.map((s) => this.vocab.get(s)!);
    if (this.cache.size < 100_000) this.cache.set(word, ids);
    return ids;
  }
}
