/**
 * The public API: `const client = await EdgeClient.connect(address, { draft })`, then
 * `await client.generate(prompt, options)`, `for await (const piece of client.stream(...))`,
 * `await client.chat(messages)`. One code base for every platform: the address's scheme picks the
 * transport (`host:port` / `grpcs://`: gRPC, Node and Electron; `ws://` / `wss://`: WebSocket,
 * browsers and React Native), and the draft is whatever ONNX Runtime flavour loaded it.
 *
 * Each generation gets a fork of the draft (own context and KV cache, shared weights); the
 * client keeps one planner per kind of request, so each starts from what the last one learned.
 */

import type { ChatMessage, Drafter, TextCodec } from "./drafter.js";
import { defaultClock, Generation, type Clock } from "./driver.js";
import { EdgespecError, TokenizerMismatchError } from "./errors.js";
import { type GenerationOptions, type GenerationParams, generationParams, pathMode } from "./params.js";
import { Planner, type PlannerConfig } from "./planner.js";
import { DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_S, Retries } from "./retries.js";
import { IncrementalDecoder } from "./detok.js";
import { type ConnectOptions, type Transport, connect } from "./transport/index.js";
import type { Result, ServerInfo } from "./types.js";
import { serverInfo } from "./wire.js";

/** A draft the client can run: the drafting interface, and (for text prompts, streaming text, chat) its tokenizer. */
export type ClientDraft = Drafter & Partial<TextCodec>;

export interface ClientOptions extends ConnectOptions {
  /** The draft (`loadDraft(...)` from "@edgespec/client/model", or any Drafter). */
  draft: ClientDraft;
  /** Per reply: no single verdict or message may take longer (seconds; default 30). */
  timeoutS?: number;
  /** Consecutive failed attempts without progress before giving up (default 3). */
  maxRetries?: number;
  /** A transport of your own (tests, a custom socket); default: chosen by the address's scheme. */
  transport?: Transport;
  planner?: Partial<PlannerConfig>;
  clock?: Clock;
}

/** What `generate`, `stream` and `chat` take: the generation's parameters and a cancellation signal. */
export interface RequestOptions extends GenerationOptions {
  signal?: AbortSignal;
}

function sleep(seconds: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
}

export class EdgeClient {
  private infoCache: ServerInfo | null = null;
  private readonly planners = new Map<string, Planner>();
  readonly timeoutS: number;
  readonly maxRetries: number;
  private readonly clock: Clock;

  private constructor(readonly transport: Transport, readonly draft: ClientDraft, private readonly options: ClientOptions) {
    this.timeoutS = options.timeoutS ?? DEFAULT_TIMEOUT_S;
    this.maxRetries = options.maxRetries ?? DEFAULT_MAX_RETRIES;
    if (!(this.timeoutS > 0)) throw new RangeError(`timeoutS must be > 0 seconds, got ${this.timeoutS}`);
    if (!(Number.isInteger(this.maxRetries) && this.maxRetries >= 0)) throw new RangeError(`maxRetries must be an integer >= 0, got ${this.maxRetries}`);
    this.clock = options.clock ?? defaultClock;
  }

  /** A client for the verifier at `address` (`host:port`, `grpcs://host:port`, `ws://host:port[/prefix]`, `wss://...`). */
  static async connect(address: string, options: ClientOptions): Promise<EdgeClient> {
    const transport = options.transport ?? await connect(address, options);
    return new EdgeClient(transport, options.draft, options);
  }

  close(): void {
    this.transport.close();
  }

  // ---- server ---------------------------------------------------------------------------

  /** What the server serves; checks that its tokenizer is the draft's. */
  async info(refresh = false): Promise<ServerInfo> {
    if (this.infoCache === null || refresh) {
      const retries = new Retries(this.maxRetries, this.clock);
      for (;;) {
        try {
          const info = serverInfo(await this.transport.info(this.timeoutS));
          if (info.tokenizerFingerprint !== this.draft.tokenizerFingerprint) {
            throw new TokenizerMismatchError(this.draft.tokenizerFingerprint, info.tokenizerFingerprint);
          }
          this.infoCache = info;
          break;
        } catch (error) {
          if (error instanceof EdgespecError) throw error;
          await sleep(retries.decide(error).delayS); // throws the typed error when giving up
        }
      }
    }
    return this.infoCache!;
  }

  /**
   * The planner for this kind of request: the same path mode, verification mode, temperature and
   * lookup (a greedy request's acceptance says little about a sampled one's). A new one starts
   * from the replica's figures and one round trip.
   */
  private async plannerFor(params: GenerationParams): Promise<Planner> {
    const mode = pathMode(params);
    const key = JSON.stringify([mode, params.mode, params.temperature, params.lookup]);
    let planner = this.planners.get(key);
    if (planner === undefined) {
      planner = new Planner(mode, this.options.planner);
      const warm = this.infoCache !== null;
      const started = this.clock();
      const info = await this.info(true);
      let rtt: number | null = (this.clock() - started) * 1000;
      if (!warm) {
        const again = this.clock(); // a cold call also connected: time a second one
        rtt = await this.transport.info(this.timeoutS).then(() => (this.clock() - again) * 1000, () => null);
      }
      planner.observe({ kind: "info", forwardMs: info.forwardMs, decodeMs: info.decodeMs, streamMs: info.streamMs, rttMs: mode === "cloud_only" ? null : rtt });
      this.planners.set(key, planner);
    }
    return planner;
  }

  // ---- generation -----------------------------------------------------------------------

  /** Token ids of a prompt, with the draft's (= the target's) tokenizer. */
  encode(prompt: string | readonly number[]): number[] {
    let ids: number[];
    if (typeof prompt === "string") {
      if (!this.draft.encode) throw new TypeError("this draft has no tokenizer: pass the prompt as token ids");
      ids = this.draft.encode(prompt);
    } else {
      ids = prompt.map((t) => {
        if (!Number.isInteger(t)) throw new RangeError(`prompt token ids must be integers, got ${t}`);
        return t;
      });
    }
    if (ids.length === 0) throw new RangeError("the prompt is empty: give at least one token of text");
    return ids;
  }

  /** Yields text as verdicts arrive; `.result` holds the Result once exhausted. */
  stream(prompt: string | readonly number[], options: RequestOptions = {}): TextStream {
    return new TextStream(this, this.encode(prompt), generationParams(options), options.signal);
  }

  /** Speculative generation (or cloud-only, as `speculate` and the planner say). */
  async generate(prompt: string | readonly number[], options: RequestOptions = {}): Promise<Result> {
    const stream = this.stream(prompt, options);
    for await (const _ of stream) {
      // (pieces are gathered in the result)
    }
    return stream.result!;
  }

  /** Cloud-only generation (the Generate RPC): the baseline, and the fallback. */
  generateCloud(prompt: string | readonly number[], options: RequestOptions = {}): Promise<Result> {
    return this.generate(prompt, { ...options, speculate: false });
  }

  /** Chat `messages` rendered with the draft's chat template, the assistant's turn opened. */
  chat(messages: ChatMessage[], options: RequestOptions = {}): Promise<Result> {
    return this.generate(this.chatPrompt(messages), options);
  }

  /** As `chat`, streamed. */
  chatStream(messages: ChatMessage[], options: RequestOptions = {}): TextStream {
    return this.stream(this.chatPrompt(messages), options);
  }

  private chatPrompt(messages: ChatMessage[]): number[] {
    if (!this.draft.applyChatTemplate) throw new TypeError("this draft has no chat template");
    return this.draft.applyChatTemplate(messages);
  }

  /** @internal */
  async start(promptIds: number[], params: GenerationParams, signal?: AbortSignal): Promise<Generation> {
    const info = await this.info();
    return new Generation(this.transport, this.draft.fork(), promptIds, params, info, {
      timeoutS: this.timeoutS, maxRetries: this.maxRetries, planner: await this.plannerFor(params), signal, clock: this.clock,
    });
  }
}

/** Async iterator of text pieces for one generation; closes its session when done or abandoned. */
export class TextStream implements AsyncIterable<string> {
  result: Result | null = null;
  private run: Generation | null = null;
  private readonly decoder: IncrementalDecoder;

  constructor(private readonly client: EdgeClient, readonly promptIds: number[], private readonly params: GenerationParams,
              private readonly signal?: AbortSignal) {
    const decode = client.draft.decode?.bind(client.draft);
    this.decoder = new IncrementalDecoder(decode ?? (() => ""));
  }

  /** The tokens generated so far. */
  get tokenIds(): number[] {
    return this.run ? [...this.run.generated] : [];
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<string> {
    const run = this.run = await this.client.start(this.promptIds, this.params, this.signal);
    let finishReason = "";
    try {
      for await (const tokens of run.chunks()) {
        const piece = this.decoder.push(tokens);
        if (piece) yield piece;
      }
      const tail = this.decoder.flush();
      if (tail) yield tail;
      finishReason = run.finishReason;
    } catch (error) {
      // Nothing committed is lost: the error carries what was generated before it.
      this.result = this.makeResult(run, "error");
      if (error instanceof EdgespecError) error.partial = this.result;
      throw error;
    } finally {
      if (this.result === null) this.result = this.makeResult(run, finishReason || "cancelled");
    }
  }

  private makeResult(run: Generation, finishReason: string): Result {
    return {
      text: this.decoder.text, tokenIds: [...run.generated], promptIds: this.promptIds, finishReason, stats: run.stats,
      rounds: [...run.rounds], segments: run.segments.map(([path, n]) => [path, n] as [string, number]),
    };
  }
}
