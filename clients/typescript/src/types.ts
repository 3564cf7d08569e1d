/** The SDK's response types, as edge/types.py and edge/stats.py: what the server serves, what a generation returned. */

export interface ServerInfo {
  modelId: string;
  tokenizerFingerprint: string;
  vocabSize: number;
  maxContext: number;
  maxK: number;
  maxNewTokens: number;
  /** "greedy" | "exact" | "token" | "coupled" (an unknown wire number as its digits). */
  modes: string[];
  version: string;
  forwardMs: number;
  decodeMs: number;
  streamMs: number;
  maxSessions: number;
  freeSessions: number;
  sessionIdleTimeoutS: number;
  firstMessageTimeoutS: number;
  defaultMaxNewTokens: number;
  maxMessageBytes: number;
  maxQEntries: number;
  authRequired: boolean;
  sendAhead: boolean;
  maxTreeTokens: number;
  replicaId: string;
}

/** One verification round as the device saw it. */
export interface RoundRecord {
  k: number;
  accepted: number;
  nextToken: number;
  draftMs: number;
  waitMs: number;
  batchSize: number;
  verifyMs: number;
}

/** Per-request counters (edge/stats.py's RequestStats); rates are derived in `rates`. */
export class RequestStats {
  rounds = 0;
  drafted = 0;
  accepted = 0;
  generated = 0;
  targetCalls = 0;
  resumes = 0;
  moves = 0;
  aheadHits = 0;
  discardedBlocks = 0;
  cloudOnlyTokens = 0;
  switches = 0;
  bytesSent = 0;
  bytesReceived = 0;
  wallS = 0;
  draftS = 0;
  waitS = 0;
  firstTokenS = 0;
  kHistory: number[] = [];
  replicaIds: string[] = [];
  /** Sampled requests: the seed every draw was keyed by (send it again to replay); null when greedy. */
  seed: bigint | null = null;

  recordRound(k: number, accepted: number, emitted: number): void {
    this.rounds += 1;
    this.targetCalls += 1;
    this.drafted += k;
    this.accepted += accepted;
    this.generated += emitted;
    this.kHistory.push(k);
  }

  get acceptanceRate(): number {
    return this.drafted ? this.accepted / this.drafted : 0;
  }

  /** Tokens committed per verification round, the recovered/bonus token included. */
  get meanAcceptanceLength(): number {
    return this.rounds ? (this.accepted + this.rounds) / this.rounds : 0;
  }

  get msPerToken(): number {
    return this.generated ? (1000 * this.wallS) / this.generated : 0;
  }

  get tokensPerS(): number {
    return this.wallS ? this.generated / this.wallS : 0;
  }
}

/** A finished generation: the text, the generated ids, why it stopped, and stats. */
export interface Result {
  text: string;
  tokenIds: number[];
  promptIds: number[];
  /** "stop_token" | "length" | "context" | "error" | "cancelled". */
  finishReason: string;
  stats: RequestStats;
  rounds: RoundRecord[];
  /** Which path produced the tokens, in order: ["speculative" | "cloud_only", how many]. */
  segments: Array<[string, number]>;
}
