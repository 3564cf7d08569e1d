/**
 * The device-side draft (edge/draft.py): an exported ONNX causal LM with its own KV cache,
 * run by whichever ONNX Runtime the platform has (onnxruntime-node, onnxruntime-web's WASM or
 * WebGPU, onnxruntime-react-native): the caller passes that runtime's `ort` namespace.
 *
 * Terms as in edge/draft.py: the *context* (`tokens`) is every token the draft knows; the cache
 * covers `tokens[0 .. cacheLen - 1]`, the rest is *pending* and fed by the next `propose`.
 * `propose(k)` runs at most k forwards (one over the pending tokens, then one per draft but the
 * last), `rollbackTo(n)` keeps the cache positions before n, `append` adds the verifier's
 * tokens. The cache is one [1, kv heads, positions, head dim] array per past input, in the
 * manifest's order (key then value per layer). A vocab-mapped draft (the real pair's, its own
 * 6,961 tokens inside) maps ids in and logits out inside its graph: its interface is the
 * target's vocabulary, and nothing here differs; an int8 graph is run as is.
 */

import { DraftIntegrityError } from "../errors.js";
import { type ChatMessage, chatTemplateOf, renderChat } from "./chat.js";
import { type Drafter, type ProposeOptions, type Proposal, checkedTokenIds, drawsFor } from "./drafter.js";
import { eosTokenIds } from "./eos.js";
import { type DraftFiles, nodeFiles, sha256Hex, urlFiles } from "./files.js";
import { type LookupConfig, lookupConfig, lookupNext } from "./lookup.js";
import { type DraftManifest, parseManifest, pastInputs, presentOutputs } from "./manifest.js";
import {
  type Draws, PositionDraws, type SamplingParams, type SparseDist, isGreedy, mixPointMass, pointMass, probsFromLogits, sample,
  truncateTopN,
} from "./sampling.js";
import { Tokenizer } from "./tokenizer.js";

// ---- the runtime, as the draft uses it (onnxruntime-node, -web and -react-native all fit) ----

export interface OrtTensor {
  readonly data: unknown;
  readonly dims: readonly number[];
  readonly type: string;
}

export interface OrtSession {
  readonly inputNames: readonly string[];
  run(feeds: Record<string, OrtTensor>): Promise<Record<string, OrtTensor>>;
  release?(): Promise<void>;
}

export interface OrtRuntime {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  Tensor: new (type: any, data: any, dims: readonly number[]) => OrtTensor;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  InferenceSession: { create(model: Uint8Array, options?: any): Promise<OrtSession> };
}

export interface LoadDraftOptions {
  /** The runtime's namespace: `import * as ort from "onnxruntime-node"` (or -web, -react-native). */
  ort: OrtRuntime;
  /** The draft directory: a path (Node), a URL (browsers, apps), or a `DraftFiles` source. */
  source: string | URL | DraftFiles;
  /** ONNX Runtime's session options (default: CPU / WASM, one thread, sequential). */
  sessionOptions?: Record<string, unknown>;
  /** SHA-256 as lower-case hex (default WebCrypto's crypto.subtle; React Native: bring one). */
  sha256?: (data: Uint8Array) => Promise<string>;
}

export interface DraftStats {
  proposals: number;
  forwards: number;
  fedTokens: number;
  draftedTokens: number;
  draftMs: number;
}

function filesOf(source: LoadDraftOptions["source"]): DraftFiles {
  if (typeof source === "object" && !(source instanceof URL)) return source;
  const text = String(source);
  return /^(https?|file|blob):/.test(text) || source instanceof URL ? urlFiles(text) : nodeFiles(text);
}

/** Reads, checks and opens a draft directory (manifest.json, model.onnx, tokenizer.json). */
export async function loadDraft(options: LoadDraftOptions): Promise<DraftModel> {
  const files = filesOf(options.source);
  const manifestText = await files.text("manifest.json");
  if (manifestText === null) {
    throw new Error(`${files.where}: manifest.json not found; a draft directory holds model.onnx, tokenizer.json and manifest.json`);
  }
  const manifest = parseManifest(manifestText, `${files.where}/manifest.json`);
  const tokenizerText = await files.text("tokenizer.json");
  if (tokenizerText === null) throw new Error(`${files.where}: tokenizer.json not found; the draft directory is incomplete`);
  const tokenizer = Tokenizer.fromJSON(tokenizerText);
  const fingerprint = await tokenizer.fingerprint(options.sha256);
  if (fingerprint !== manifest.tokenizer_fingerprint) {
    throw new Error(`${files.where}/tokenizer.json has fingerprint ${fingerprint}, but the draft was exported with ` +
      `${manifest.tokenizer_fingerprint}; re-export the draft`);
  }
  const graph = await files.bytes(manifest.onnx_file);
  await verifyGraph(graph, manifest, `${files.where}/${manifest.onnx_file}`, options.sha256 ?? sha256Hex);
  const session = await options.ort.InferenceSession.create(graph, {
    executionMode: "sequential", intraOpNumThreads: 1, interOpNumThreads: 1, logSeverityLevel: 3, ...options.sessionOptions,
  });
  const inputs = [...session.inputNames].sort();
  if (JSON.stringify(inputs) !== JSON.stringify([...manifest.input_names].sort())) {
    throw new Error(`${files.where}/${manifest.onnx_file} has inputs ${JSON.stringify(session.inputNames)} but manifest.json lists ` +
      `${JSON.stringify(manifest.input_names)}; the two files come from different exports`);
  }
  const eos = [...new Set([...manifest.eos_token_ids, ...(await eosTokenIds(files, tokenizer.spec, manifest.vocab_size))])];
  const shared: Shared = { ort: options.ort, session, manifest, tokenizer, eos, chatTemplate: await chatTemplateOf(files) };
  return new DraftModel(shared);
}

/** Refuses a graph whose sha256 is not the manifest's (manifests before format 3 record none). */
export async function verifyGraph(graph: Uint8Array, manifest: DraftManifest, where: string,
                                  sha256: (data: Uint8Array) => Promise<string> = sha256Hex): Promise<void> {
  if (!manifest.onnx_sha256) return;
  const actual = await sha256(graph);
  if (actual !== manifest.onnx_sha256) {
    throw new DraftIntegrityError(`${where} has sha256 ${actual.slice(0, 16)}..., but manifest.json records ` +
      `${manifest.onnx_sha256.slice(0, 16)}...: the graph was modified or comes from another export; re-export or re-download the draft`);
  }
}

interface Shared {
  ort: OrtRuntime;
  session: OrtSession;
  manifest: DraftManifest;
  tokenizer: Tokenizer;
  eos: number[];
  chatTemplate: string | null;
}

type KvArray = Float32Array | Uint16Array;

/** An ONNX draft that proposes tokens; one context per instance (`fork` for another, sharing the weights). */
export class DraftModel implements Drafter {
  readonly manifest: DraftManifest;
  readonly tokenizer: Tokenizer;
  readonly vocabSize: number;
  readonly eosTokenIds: number[];
  readonly stats: DraftStats = { proposals: 0, forwards: 0, fedTokens: 0, draftedTokens: 0, draftMs: 0 };
  tokens: number[] = [];
  /** Positions the cache covers. */
  cacheLen = 0;
  private past: KvArray[] = [];
  /** Positions the arrays in `past` hold (>= cacheLen: a rollback trims them lazily). */
  private pastLen = 0;

  constructor(private readonly shared: Shared) {
    this.manifest = shared.manifest;
    this.tokenizer = shared.tokenizer;
    this.vocabSize = shared.manifest.vocab_size;
    this.eosTokenIds = shared.eos;
    this.reset([]);
  }

  get tokenizerFingerprint(): string {
    return this.manifest.tokenizer_fingerprint;
  }

  get maxPositions(): number {
    return this.manifest.max_positions;
  }

  /** A draft with its own context and cache sharing this one's session (ONNX Runtime runs sessions concurrently). */
  fork(): DraftModel {
    return new DraftModel(this.shared);
  }

  async release(): Promise<void> {
    await this.shared.session.release?.();
  }

  // -- text ---------------------------------------------------------------------------------

  encode(text: string): number[] {
    return this.tokenizer.encode(text);
  }

  decode(ids: readonly number[]): string {
    return this.tokenizer.decode(ids);
  }

  /** The prompt ids of chat `messages` under the draft's chat template (the assistant's turn opened). */
  applyChatTemplate(messages: ChatMessage[]): number[] {
    if (this.shared.chatTemplate === null) throw new Error("this draft has no chat template (chat_template.jinja or tokenizer_config.json)");
    return this.tokenizer.encode(renderChat(this.shared.chatTemplate, messages));
  }

  // -- context ------------------------------------------------------------------------------

  /** Starts a new context with an empty cache; the context is fed by the next propose. */
  reset(contextIds: readonly number[]): void {
    const context = checkedTokenIds(contextIds, this.vocabSize, "contextIds");
    this.checkLength(context.length, "the context");
    this.tokens = context;
    this.trimCache(0);
  }

  /** Extends the context (e.g. with the verifier's token); fed by the next propose. */
  append(tokenIds: readonly number[]): void {
    const added = checkedTokenIds(tokenIds, this.vocabSize, "tokenIds");
    this.checkLength(this.tokens.length + added.length, "the context after append");
    this.tokens.push(...added);
  }

  /** Keeps tokens[0 .. n - 1] and the cache positions among them. */
  rollbackTo(n: number): void {
    if (!(Number.isInteger(n) && n >= 0 && n <= this.tokens.length)) {
      throw new RangeError(`rollbackTo(${n}) is outside [0, ${this.tokens.length}] (the current context length)`);
    }
    this.tokens.length = n;
    this.trimCache(Math.min(this.cacheLen, n));
  }

  private trimCache(length: number): void {
    if (length === 0) {
      const empty = this.manifest.kv_dtype === "float16" ? new Uint16Array(0) : new Float32Array(0);
      this.past = pastInputs(this.manifest).map(() => empty);
      this.pastLen = 0;
    }
    this.cacheLen = length;
  }

  /** The cache arrays cut to cacheLen positions (copied per head: positions are the inner-but-one axis). */
  private pastFeeds(): Record<string, OrtTensor> {
    const { num_kv_heads: heads, head_dim: dim, kv_dtype: dtype } = this.manifest;
    if (this.pastLen !== this.cacheLen) {
      const keep = this.cacheLen * dim;
      const stride = this.pastLen * dim;
      this.past = this.past.map((kv) => {
        const cut = new (kv.constructor as { new (n: number): KvArray })(heads * keep);
        for (let h = 0; h < heads; h++) cut.set(kv.subarray(h * stride, h * stride + keep), h * keep);
        return cut;
      });
      this.pastLen = this.cacheLen;
    }
    const feeds: Record<string, OrtTensor> = {};
    pastInputs(this.manifest).forEach((name, i) => {
      feeds[name] = new this.shared.ort.Tensor(dtype, this.past[i], [1, heads, this.cacheLen, dim]);
    });
    return feeds;
  }

  // -- drafting -----------------------------------------------------------------------------

  /**
   * Drafts k tokens after the context and appends them to `tokens` (edge/draft.py's propose):
   * greedy (no sampling): the argmax, or the lookup's token where it has one; sampled: each
   * draft drawn from truncateTopN(probsFromLogits(logits, sampling), topN) (mixed with the
   * lookup's point mass), that q returned. Coupled draws race q at the draft's absolute position.
   */
  async propose(k: number, options: ProposeOptions = {}): Promise<Proposal> {
    this.readyToDraft(k);
    const lookup = lookupOf(options.lookup);
    const sampling = isGreedy(options.sampling) ? null : options.sampling!;
    let draws: Draws | undefined;
    if (sampling) draws = drawsFor(options) ?? new PositionDraws(BigInt(sampling.seed ?? 0));
    const started = performance.now();
    const drafts: number[] = [];
    const q: SparseDist[] = [];
    const runnersUp: Array<[number, number]> = [];
    for (let i = 0; i < k; i++) {
      const found = lookup ? lookupNext(this.tokens, lookup) : undefined;
      let token: number;
      if (sampling) {
        // (where the lookup alone decides the model is not run: its tokens wait for the next forward)
        const dist = await this.sampledQ(found, sampling, options.topN ?? 0, options.lookupWeight ?? 1,
          async () => lastRow(await this.feed(this.tokens.slice(this.cacheLen)), this.vocabSize));
        // NOTE: the context is the whole sequence, so tokens.length is the absolute position (coupled draws).
        token = sample(dist, draws!, this.tokens.length);
        q.push(dist);
      } else {
        const [chosen, runnerUp] = await this.greedyDraft(found, Boolean(options.alternatives));
        token = chosen;
        if (runnerUp) runnersUp.push(runnerUp);
      }
      this.tokens.push(token);
      drafts.push(token);
    }
    const elapsed = performance.now() - started;
    this.stats.proposals += 1;
    this.stats.draftedTokens += k;
    this.stats.draftMs += elapsed;
    return { tokens: drafts, q: sampling ? q : null, draftMs: elapsed, alternatives: options.alternatives && !sampling ? runnersUp : null };
  }

  /** The q a sampled draft is drawn from (edge/draft.py's sampled_q). */
  private async sampledQ(found: number | undefined, sampling: SamplingParams, topN: number, lookupWeight: number,
                         logits: () => Promise<Float32Array>): Promise<SparseDist> {
    if (found !== undefined && lookupWeight === 1) return pointMass(found);
    const dist = truncateTopN(probsFromLogits(await logits(), sampling), topN);
    return found === undefined ? dist : mixPointMass(dist, found, lookupWeight, topN);
  }

  private readyToDraft(k: number): void {
    if (!Number.isInteger(k) || k < 1) throw new RangeError(`k must be an integer >= 1, got ${k}`);
    if (this.tokens.length === 0) throw new Error("the context is empty: call reset(promptIds) with at least one token first");
    this.checkLength(this.tokens.length + k - 1, `the context plus k=${k} drafts`);
    // Everything cached (after a rollback into the cache): re-feed the last token, since the
    // cache keeps keys and values, not the logits that follow them.
    if (this.cacheLen === this.tokens.length) this.trimCache(this.cacheLen - 1);
  }

  private async greedyDraft(found: number | undefined, alternatives: boolean): Promise<[number, [number, number] | null]> {
    if (found !== undefined && !alternatives) return [found, null]; // the lookup alone decides: no forward
    const logits = lastRow(await this.feed(this.tokens.slice(this.cacheLen)), this.vocabSize);
    const modelToken = argmax(logits);
    const token = found ?? modelToken;
    return [token, alternatives ? runnerUp(logits, token, modelToken) : null];
  }

  /**
   * Appends tokens the device did not draft (streamed by the cloud) and returns what greedy
   * drafting (with `lookup`) would have proposed at each, from one forward; the cache keeps up.
   */
  async observe(tokenIds: readonly number[], lookup?: LookupConfig): Promise<number[]> {
    const added = checkedTokenIds(tokenIds, this.vocabSize, "tokenIds");
    if (added.length === 0) return [];
    const [logits, offset] = await this.feedObserved(added);
    const predicted: number[] = [];
    added.forEach((token, i) => {
      const guess = lookup ? lookupNext(this.tokens, lookup) : undefined;
      predicted.push(guess ?? argmax(row(logits, offset + i, this.vocabSize)));
      this.tokens.push(token);
    });
    return predicted;
  }

  /**
   * Sampled: appends streamed tokens and returns, per token, the chance a draft there would have
   * been accepted: coupled (`draws`): 1 iff the coupled draft from q is the token; otherwise
   * min(1, q(y) / p(y)) with the stream's p(y), or q(y) without it (edge/draft.py).
   */
  async observeChances(tokenIds: readonly number[], options: {
    sampling: SamplingParams; lookup?: LookupConfig; lookupWeight?: number; draws?: PositionDraws; topN?: number;
    targetProbs?: readonly (number | null)[];
  }): Promise<number[]> {
    const added = checkedTokenIds(tokenIds, this.vocabSize, "tokenIds");
    if (added.length === 0) return [];
    const [logits, offset] = await this.feedObserved(added);
    const chances: number[] = [];
    for (let i = 0; i < added.length; i++) {
      const token = added[i];
      const guess = options.lookup ? lookupNext(this.tokens, options.lookup) : undefined;
      const dist = await this.sampledQ(guess, options.sampling, options.topN ?? 0, options.lookupWeight ?? 1,
        async () => row(logits, offset + i, this.vocabSize));
      if (options.draws) {
        chances.push(options.draws.sample(dist, this.tokens.length) === token ? 1 : 0);
      } else {
        const p = options.targetProbs?.[i] ?? null;
        const qy = dist.probOf(token);
        chances.push(p === null || !(p > 0 && p <= 1) ? qy : Math.min(1, qy / p));
      }
      this.tokens.push(token);
    }
    return chances;
  }

  private async feedObserved(added: number[]): Promise<[Float32Array, number]> {
    if (this.tokens.length === 0) throw new Error("the context is empty: call reset(promptIds) with at least one token first");
    this.checkLength(this.tokens.length + added.length, "the context after observe");
    if (this.cacheLen === this.tokens.length) this.trimCache(this.cacheLen - 1);
    const offset = this.tokens.length - 1 - this.cacheLen;
    return [await this.feed([...this.tokens.slice(this.cacheLen), ...added.slice(0, -1)]), offset];
  }

  /** One forward over `ids` against the cache; extends it. Returns the logits [n * V]. */
  private async feed(ids: number[]): Promise<Float32Array> {
    const { ort, session, manifest } = this.shared;
    const n = ids.length;
    const feeds = this.pastFeeds();
    feeds[manifest.input_names[0]] = new ort.Tensor("int64", BigInt64Array.from(ids, (t) => BigInt(t)), [1, n]);
    feeds[manifest.input_names[1]] = new ort.Tensor("int64", BigInt64Array.from(ids, (_, i) => BigInt(this.cacheLen + i)), [1, n]);
    const outputs = await session.run(feeds);
    this.past = presentOutputs(manifest).map((name) => outputs[name].data as KvArray);
    this.cacheLen += n;
    this.pastLen = this.cacheLen;
    this.stats.forwards += 1;
    this.stats.fedTokens += n;
    return outputs[manifest.output_names[0]].data as Float32Array;
  }

  /** Logits [len * V] over `contextIds` from an empty cache; leaves the model's state alone. */
  async logitsForContext(contextIds: readonly number[]): Promise<Float32Array> {
    const context = checkedTokenIds(contextIds, this.vocabSize, "contextIds");
    if (context.length === 0) throw new Error("contextIds must hold at least one token");
    this.checkLength(context.length, "the context");
    const scratch = this.fork();
    scratch.tokens = context;
    return scratch.feed(context);
  }

  private checkLength(length: number, what: string): void {
    if (length > this.manifest.max_positions) {
      throw new RangeError(`${what} is ${length} tokens, more than the draft's max_positions ${this.manifest.max_positions}; ` +
        "shorten the prompt or lower k");
    }
  }
}

function lookupOf(lookup: ProposeOptions["lookup"]): LookupConfig | null {
  if (lookup === true) return lookupConfig();
  return lookup ? lookup : null;
}

function row(logits: Float32Array, index: number, vocab: number): Float32Array {
  return logits.subarray(index * vocab, (index + 1) * vocab);
}

function lastRow(logits: Float32Array, vocab: number): Float32Array {
  return row(logits, logits.length / vocab - 1, vocab);
}

function argmax(values: Float32Array): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

/** [the best token other than `chosen`, the model's probability of `chosen`] (edge/draft.py's _runner_up). */
function runnerUp(logits: Float32Array, chosen: number, modelToken: number): [number, number] {
  const max = logits[modelToken];
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
  const probability = Math.exp(logits[chosen] - max) / sum;
  if (chosen !== modelToken) return [modelToken, probability];
  let other = chosen === 0 ? 1 : 0;
  for (let i = 0; i < logits.length; i++) if (i !== chosen && logits[i] > logits[other]) other = i;
  return [other, probability];
}
