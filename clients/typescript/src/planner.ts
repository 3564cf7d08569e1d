/**
 * Which path produces the next tokens, how many drafts a block holds, and how many blocks fly: a
 * port of edge/planner.py. Its knobs in `PlannerConfig`; what the device measured in `State`,
 * changed only by `observe(state, config, event)`; and `decide(state, config, ...)`, a pure
 * function of the two. It reads no clock: every time is an event's.
 *
 * Speculation's price per token at k drafts is a round over what it commits:
 *
 *     fresh(k)  = round trip + verify forward(k) + device(k)
 *     held(k)   = max(forward(k) + device(k), fresh(k) / depth)   (a block sent ahead that held)
 *     round(k)  = holds(k) held(k) + (1 - holds(k)) fresh(k)      (sent ahead only where it pays)
 *     spec      = min over k of round(k) / E[tokens | k]  x  bias
 *
 * The stream's price is its measured rate (the replica's own figure before any) plus the shadow's
 * drafting at its share. A request starts on the cheaper path; mid-request the path switches when
 * the other is cheaper by `margin` and the tokens left repay two switches.
 */

import { Acceptance, Replay } from "./acceptance.js";

export type Path = "speculative" | "cloud_only";
export type PlannerMode = "auto" | "speculative" | "cloud_only";

/** The planner's knobs (edge/planner.py's PlannerConfig documents each default's reason). */
export interface PlannerConfig {
  margin: number;
  maxDepth: number;
  priorAcceptance: number;
  shrink: number;
  acceptanceDecay: number;
  newTextWeight: number;
  window: number;
  minRounds: number;
  minStreamTokens: number;
  enterDrafts: number;
  exploreLoss: number;
  shadowShare: number;
  shadowLook: number;
  biasLimit: number;
  prefillForwards: number;
}

export const DEFAULT_PLANNER_CONFIG: Readonly<PlannerConfig> = Object.freeze({
  margin: 0.1, maxDepth: 4, priorAcceptance: 0.7, shrink: 1, acceptanceDecay: 0.97, newTextWeight: 0.2, window: 5,
  minRounds: 2, minStreamTokens: 8, enterDrafts: 12, exploreLoss: 0.1, shadowShare: 0.03, shadowLook: 16,
  biasLimit: 1.5, prefillForwards: 4,
});

/** A frozen, validated config (errors name the field). */
export function plannerConfig(changes: Partial<PlannerConfig> = {}): Readonly<PlannerConfig> {
  const c = { ...DEFAULT_PLANNER_CONFIG, ...changes };
  const ranges: Record<string, (v: number) => boolean> = {
    "(0, 1)": (v) => v > 0 && v < 1, "[0, 1)": (v) => v >= 0 && v < 1, ">= 1": (v) => v >= 1, ">= 0": (v) => v >= 0,
  };
  const rules: Array<[keyof PlannerConfig, string]> = [
    ["margin", "[0, 1)"], ["priorAcceptance", "(0, 1)"], ["acceptanceDecay", "(0, 1)"], ["newTextWeight", "(0, 1)"],
    ["exploreLoss", "(0, 1)"], ["shadowShare", "(0, 1)"], ["maxDepth", ">= 1"], ["window", ">= 1"], ["minRounds", ">= 1"],
    ["biasLimit", ">= 1"], ["minStreamTokens", ">= 1"], ["shadowLook", ">= 1"], ["shrink", ">= 0"], ["enterDrafts", ">= 0"],
    ["prefillForwards", ">= 0"],
  ];
  for (const [name, allowed] of rules) {
    if (!ranges[allowed]!(c[name])) throw new RangeError(`PlannerConfig.${name} must be ${allowed}, got ${c[name]}`);
  }
  return Object.freeze(c);
}

// ---- events: what the driver saw --------------------------------------------------------------

export type Event =
  | { kind: "start"; maxNewTokens: number; maxK: number; k: number | "auto"; sendAhead: number | "auto" }
  | { kind: "segment"; path: Path }
  /** The replica's figures (Info); rttMs: the call's round trip where it measured one. */
  | { kind: "info"; forwardMs: number; decodeMs: number; streamMs: number; rttMs: number | null }
  | { kind: "round"; k: number; accepted: number; tokens: number; wallMs: number; waitMs: number | null; forwardMs: number; draftMs: number | null }
  | { kind: "first_token"; ms: number }
  | { kind: "streamed"; ms: number; tokens: number }
  | { kind: "shadowed"; chances: number[]; draftMs: number | null; afterGap: boolean };

// ---- what the device measured ---------------------------------------------------------------

/** An exponentially weighted least-squares line y = base + slope x (slope >= 0). */
export class Line {
  sums = [0, 0, 0, 0, 0]; // w, wx, wxx, wy, wxy

  constructor(readonly decay: number) {}

  add(x: number, y: number): void {
    const values = [1, x, x * x, y, x * y];
    this.sums = this.sums.map((s, i) => this.decay * s + values[i]!);
  }

  at(x: number): number | null {
    const [w, wx, wxx, wy, wxy] = this.sums as [number, number, number, number, number];
    if (w < 1e-9) return null;
    const mx = wx / w;
    const my = wy / w;
    const variance = wxx / w - mx * mx;
    // NOTE: no slope until blocks of k apart were measured (fitted on one k, noise kept k short)
    const slope = variance >= 1 ? Math.max((wxy / w - mx * my) / variance, 0) : 0;
    return Math.max(my + slope * (x - mx), 0);
  }
}

/** The median of the last `size` samples; null before any. */
export class Median {
  samples: number[] = [];
  value: number | null = null;

  constructor(readonly size: number) {}

  add(x: number): void {
    this.samples = [...this.samples, x].slice(-this.size);
    const sorted = [...this.samples].sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    this.value = sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
  }
}

export class State {
  rtt: Median;
  forward: Line;
  device: Line;
  /** The last streams' measured ms per token (NaN: a stream not yet priced). */
  streams: number[] = [];
  replicaStream: number | null = null;
  prefill: Median;
  bias: Median;
  shadow: Median;
  acceptance: Acceptance;
  replay = new Replay(16);
  maxK = 16;
  k: number | "auto" = "auto";
  sendAhead: number | "auto" = "auto";
  segmentRounds = 0;
  segmentTokens = 0;
  segmentProbes = 0;
  /** Positions a block sent ahead now continues (the blocks before it held). */
  chain = 0;

  constructor(config: PlannerConfig) {
    this.forward = new Line(1 - 1 / (4 * config.window)); // (a slope needs many samples)
    this.device = new Line(1 - 1 / (4 * config.window));
    this.rtt = new Median(config.window);
    this.prefill = new Median(config.window);
    this.bias = new Median(config.window);
    this.shadow = new Median(config.window);
    this.acceptance = new Acceptance(config.acceptanceDecay, config.shrink, config.priorAcceptance);
  }
}

/** Folds one event into the state. */
export function observe(s: State, config: PlannerConfig, event: Event): void {
  switch (event.kind) {
    case "start":
      s.maxK = event.maxK;
      s.k = event.k;
      s.sendAhead = event.sendAhead;
      if (s.replay.k !== s.maxK) s.replay = new Replay(s.maxK);
      s.replay.restart();
      s.acceptance.forget(config.newTextWeight);
      break;
    case "segment":
      s.segmentRounds = s.segmentTokens = s.segmentProbes = s.chain = 0;
      if (event.path === "cloud_only") s.streams = [...s.streams.slice(-config.window + 1), NaN];
      break;
    case "info":
      if (event.forwardMs > 0) {
        const [w, wx] = s.forward.sums as [number, number]; // (at no known k: at the mean k, a sample moves the level)
        s.forward.add(w > 1e-9 ? wx / w : 1, event.forwardMs);
      }
      if (event.streamMs > 0 || event.decodeMs > 0) s.replicaStream = Math.max(event.streamMs, event.decodeMs);
      if (event.rttMs !== null) {
        s.rtt.add(event.rttMs);
        s.segmentProbes += 1;
      }
      break;
    case "round":
      observeRound(s, config, event);
      break;
    case "first_token": {
      const step = s.replicaStream ?? s.forward.at(1);
      if (s.rtt.value !== null && step !== null) s.prefill.add(Math.max(event.ms - s.rtt.value - step, 0));
      break;
    }
    case "streamed":
      s.segmentTokens = event.tokens;
      // (fewer tokens: a burst behind the prefill; a median over streams: one stall is no price)
      if (event.tokens >= config.minStreamTokens && s.streams.length) s.streams[s.streams.length - 1] = event.ms / event.tokens;
      break;
    case "shadowed":
      if (event.afterGap) s.replay.restart();
      s.acceptance.addCounts(...s.replay.feed(event.chances));
      if (event.draftMs !== null && event.chances.length > 0) s.shadow.add(event.draftMs / event.chances.length);
      break;
  }
}

/**
 * A segment's first round also carried the Open (the replica's prefill): its wait beyond a round
 * trip and a forward is what a switch pays; its times price no round. Blocks sent ahead that hold
 * are one long block to acceptance: their drafts are deeper positions of it.
 */
function observeRound(s: State, config: PlannerConfig, r: Extract<Event, { kind: "round" }>): void {
  const accepted = Math.min(Math.max(r.tokens - 1, 0), r.k); // (a tree's accepted leaves count as its chain's)
  const after = r.waitMs === null ? s.chain : 0; // (a block sent ahead is verified only behind ones that held)
  if (after <= s.maxK) s.acceptance.add(accepted, r.k, after, s.maxK + 1); // (deeper positions price no block)
  s.chain = accepted === r.k ? after + r.k + 1 : 0;
  s.segmentRounds += 1;
  if (s.segmentRounds === 1) {
    if (r.waitMs !== null && s.rtt.value !== null) s.prefill.add(Math.max(r.waitMs - s.rtt.value - r.forwardMs, 0));
    return;
  }
  if (r.forwardMs > 0) s.forward.add(r.k, r.forwardMs);
  if (r.waitMs !== null) {
    s.rtt.add(Math.max(r.waitMs - r.forwardMs, 0));
    s.device.add(r.k, Math.max(r.wallMs - r.waitMs, 0));
  }
  const c = costs(s, config, r.k); // the model's error once its parts are measured, like with like
  if (c !== null && c[0] > 0) {
    const predicted = r.waitMs === null ? c[1] : c[0]; // (a held round against a held one's price)
    s.bias.add(Math.min(Math.max(r.wallMs / predicted, 1 / config.biasLimit), config.biasLimit));
  }
}

// ---- the decision ---------------------------------------------------------------------------

export interface Decision {
  path: Path;
  /** Drafts in the next block. */
  k: number;
  /** Blocks to keep in flight (1: never send ahead). */
  depth: number;
  specMs: number | null;
  cloudMs: number | null;
  reason: string;
}

/**
 * A round of k drafts: [fresh, held, device, depth], depth the blocks that cover a round trip (no
 * more travel in one); null until the round trip and the forward are known.
 */
function costs(s: State, config: PlannerConfig, k: number): [number, number, number, number] | null {
  const forward = s.forward.at(k);
  const rtt = s.rtt.value;
  if (rtt === null || forward === null) return null;
  const device = s.device.at(k) ?? 0; // (until a round measured it: the round trip dominates a first guess)
  const fresh = rtt + forward + device;
  const perBlock = forward + device;
  const depth = s.sendAhead !== "auto"
    ? Math.max(1, Math.floor(s.sendAhead))
    : Math.max(2, Math.min(config.maxDepth, 1 + Math.ceil(rtt / Math.max(perBlock, 1))));
  return [fresh, depth > 1 ? Math.max(perBlock, fresh / depth) : fresh, device, depth];
}

/** [best k, speculation's ms per token there with the bias, blocks in flight]. */
export function forecast(s: State, config: PlannerConfig): [number, number | null, number] {
  const [tokens, holds] = s.acceptance.tokensAndHolds(s.maxK);
  let best: [number, number, number] = [Infinity, s.maxK, s.sendAhead === "auto" ? 1 : Math.floor(s.sendAhead)];
  for (let k = 1; k <= s.maxK; k++) {
    const c = costs(s, config, k);
    if (c === null) return [best[1], null, best[2]];
    const [fresh, held, device, depth] = c;
    // A block goes ahead where what it saves when it holds pays for drafting it.
    const ahead = depth > 1 && (s.sendAhead !== "auto" || holds[k]! * (fresh - held) >= device);
    const rate = (ahead ? holds[k]! * held + (1 - holds[k]!) * fresh : fresh) / tokens[k]!;
    if (rate < best[0]) best = [rate, k, ahead ? depth : 1];
  }
  const bias = s.bias.samples.length > Math.floor(config.window / 2) ? s.bias.value : null; // (one round is no error yet)
  return [best[1], best[0] * (bias || 1), best[2]];
}

/** The median of the last streams' rates; null before any was priced. */
function streamRate(s: State): number | null {
  const rates = s.streams.filter((r) => !Number.isNaN(r)).sort((a, b) => a - b);
  if (rates.length === 0) return null;
  const mid = rates.length >> 1;
  return rates.length % 2 ? rates[mid]! : (rates[mid - 1]! + rates[mid]!) / 2;
}

function shadowShare(s: State, config: PlannerConfig, stream: number): number {
  const shadow = s.shadow.value;
  return !shadow ? 1 : Math.min(1, (config.shadowShare * stream) / shadow);
}

/** The stream's ms per token (measured, else the replica's, else a forward), plus the shadow's share. */
export function cloudMs(s: State, config: PlannerConfig): number | null {
  const stream = streamRate(s) || s.replicaStream || s.forward.at(1);
  if (stream === null) return null; // (0 is a price: a forward fitted down to nothing)
  return stream + shadowShare(s, config, stream) * (s.shadow.value ?? 0);
}

/**
 * Whether the shadow runs over the stream's token at `position`: every one while that costs under
 * shadowShare of the stream, else the last shadowLook of each period that keeps the share. The
 * first look opens the stream, and while the draft is little known every token is worth watching.
 */
export function shadowWanted(s: State, config: PlannerConfig, position: number): boolean {
  if (position < config.shadowLook || s.acceptance.seen < config.enterDrafts) return true;
  const stream = streamRate(s) || s.replicaStream;
  const share = !stream ? 1 : shadowShare(s, config, stream);
  const period = Math.ceil(config.shadowLook / share);
  return share >= 1 || position % period >= period - config.shadowLook;
}

/** A switch: the round trip that opens the other path and the replica's prefill. */
export function switchCostMs(s: State, config: PlannerConfig): number {
  const prefill = s.prefill.value ?? config.prefillForwards * (s.forward.at(1) ?? 0);
  return (s.rtt.value ?? 0) + prefill;
}

/** The path for the tokens still to come (`current` null: a request's start), the next k and depth; pure. */
export function decide(s: State, config: PlannerConfig, mode: PlannerMode, current: Path | null, remaining: number): Decision {
  let [k, spec, depth] = forecast(s, config);
  if (s.k !== "auto") k = s.k;
  const cloud = cloudMs(s, config);
  const [path, reason] = choosePath(s, config, mode, current, remaining, spec, cloud);
  return { path, k, depth, specMs: spec, cloudMs: cloud, reason };
}

function choosePath(s: State, config: PlannerConfig, mode: PlannerMode, current: Path | null, remaining: number,
                    spec: number | null, cloud: number | null): [Path, string] {
  if (mode !== "auto") return [mode, mode];
  if (current === null) return start(s, config, remaining, spec, cloud);
  if (spec === null || cloud === null) return [current, ""];
  const switchMs = 2 * switchCostMs(s, config);
  if (current === "speculative") {
    if (s.segmentRounds >= config.minRounds && cloud * (1 + config.margin) < spec && remaining * (spec - cloud) > switchMs) {
      return ["cloud_only", "cloud-only predicted faster"];
    }
    return [current, ""];
  }
  const ready = s.segmentTokens >= config.minStreamTokens && s.segmentProbes > 0;
  if (ready && s.acceptance.drafts() >= config.enterDrafts && spec * (1 + config.margin) < cloud && remaining * (cloud - spec) > switchMs) {
    return ["speculative", "speculation predicted faster"];
  }
  return [current, ""];
}

function start(s: State, config: PlannerConfig, budget: number, spec: number | null, cloud: number | null): [Path, string] {
  if (spec === null || cloud === null) return ["speculative", "nothing measured: speculate, and learn"];
  if (s.acceptance.seen < config.enterDrafts) {
    // A hopeless draft costs up to three rounds of a token each (the first rides with the Open;
    // it shows by the third), and a switch.
    const fresh = costs(s, config, s.maxK)?.[0] ?? 0;
    if (3 * Math.max(fresh - cloud, 0) + switchCostMs(s, config) > config.exploreLoss * budget * cloud) {
      return ["cloud_only", "the shadow judges the draft: a wrong guess costs too much here"];
    }
    return ["speculative", "exploring the draft"];
  }
  if ((s.rtt.value ?? 0) + budget * spec <= budget * cloud) return ["speculative", "predicted"]; // (one more round trip to start)
  return ["cloud_only", "cloud-only predicted faster"];
}

// ---- one client's planner -------------------------------------------------------------------

/** One decision: the path a request started on (fromPath null) or a switch. */
export interface Switch {
  atToken: number;
  fromPath: Path | null;
  toPath: Path;
  predictedSpecMsPerToken: number | null;
  predictedCloudMsPerToken: number | null;
  reason: string;
}

/** A client's planner: config, state, and the current request's decisions (`switchLog`). */
export class Planner {
  readonly config: Readonly<PlannerConfig>;
  readonly state: State;
  switchLog: Switch[] = [];
  private budget = 0;

  constructor(readonly mode: PlannerMode = "auto", config: Partial<PlannerConfig> = {}) {
    if (!["auto", "speculative", "cloud_only"].includes(mode)) throw new RangeError(`mode must be auto, speculative or cloud_only, got ${mode}`);
    this.config = plannerConfig(config);
    this.state = new State(this.config);
  }

  observe(event: Event): void {
    if (event.kind === "start") {
      this.switchLog = [];
      this.budget = event.maxNewTokens;
    }
    observe(this.state, this.config, event);
  }

  /** `decide` on this planner's state; a start or a change of path is logged. */
  decide(current: Path | null, remaining: number): Decision {
    const decision = decide(this.state, this.config, this.mode, current, remaining);
    if (decision.path !== current) {
      this.switchLog.push({
        atToken: this.budget - remaining, fromPath: current, toPath: decision.path, predictedSpecMsPerToken: decision.specMs,
        predictedCloudMsPerToken: decision.cloudMs, reason: decision.reason,
      });
    }
    return decision;
  }

  shadowWanted(position: number): boolean {
    return shadowWanted(this.state, this.config, position);
  }
}
