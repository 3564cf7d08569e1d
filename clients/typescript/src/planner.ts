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
  memory: number;
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
  margin: 0.05, maxDepth: 4, priorAcceptance: 0.7, shrink: 2, acceptanceDecay: 0.97, newTextWeight: 0.5, memory: 0.8,
  minRounds: 2, minStreamTokens: 8, enterDrafts: 16, exploreLoss: 0.1, shadowShare: 0.03, shadowLook: 16,
  biasLimit: 1.5, prefillForwards: 4,
});

/** A frozen, validated config (errors name the field). */
export function plannerConfig(changes: Partial<PlannerConfig> = {}): Readonly<PlannerConfig> {
  const c = { ...DEFAULT_PLANNER_CONFIG, ...changes };
  for (const name of ["margin", "priorAcceptance", "acceptanceDecay", "newTextWeight", "memory", "exploreLoss", "shadowShare"] as const) {
    if (!(c[name] >= 0 && c[name] < 1) || (name !== "margin" && c[name] === 0)) throw new RangeError(`PlannerConfig.${name} must be in (0, 1), got ${c[name]}`);
  }
  for (const name of ["maxDepth", "minRounds", "minStreamTokens", "shadowLook"] as const) {
    if (!(c[name] >= 1)) throw new RangeError(`PlannerConfig.${name} must be >= 1, got ${c[name]}`);
  }
  for (const name of ["shrink", "enterDrafts", "prefillForwards"] as const) {
    if (!(c[name] >= 0)) throw new RangeError(`PlannerConfig.${name} must be >= 0, got ${c[name]}`);
  }
  if (!(c.biasLimit >= 1)) throw new RangeError(`PlannerConfig.biasLimit must be >= 1, got ${c.biasLimit}`);
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

  meanX(): number {
    return this.sums[0]! > 1e-9 ? this.sums[1]! / this.sums[0]! : 1;
  }

  at(x: number): number | null {
    const [w, wx, wxx, wy, wxy] = this.sums as [number, number, number, number, number];
    if (w < 1e-9) return null;
    const mx = wx / w;
    const my = wy / w;
    const variance = wxx / w - mx * mx;
    const slope = variance > 1e-6 ? Math.max((wxy / w - mx * my) / variance, 0) : 0;
    return Math.max(my + slope * (x - mx), 0);
  }
}

function ewma(old: number | null, value: number, memory: number): number {
  return old === null ? value : memory * old + (1 - memory) * value;
}

export class State {
  rtt: number | null = null;
  forward: Line;
  device: Line;
  stream: number | null = null;
  replicaStream: number | null = null;
  prefill: number | null = null;
  bias = 1;
  shadowMs: number | null = null;
  acceptance: Acceptance;
  replay = new Replay(16);
  maxK = 16;
  k: number | "auto" = "auto";
  sendAhead: number | "auto" = "auto";
  segmentRounds = 0;
  segmentTokens = 0;
  segmentProbes = 0;

  constructor(config: PlannerConfig) {
    this.forward = new Line(config.memory);
    this.device = new Line(config.memory);
    this.acceptance = new Acceptance(config.acceptanceDecay, config.shrink, config.priorAcceptance);
  }
}

function replayed(s: State, rounds: Array<[number[], number[]]>): void {
  for (const [reached, accepted] of rounds) s.acceptance.addCounts(reached, accepted);
}

/** Folds one event into the state. */
export function observe(s: State, config: PlannerConfig, event: Event): void {
  switch (event.kind) {
    case "start":
      s.maxK = event.maxK;
      s.k = event.k;
      s.sendAhead = event.sendAhead;
      if (s.replay.k !== s.maxK) s.replay = new Replay(s.maxK);
      replayed(s, s.replay.restart());
      s.acceptance.forget(config.newTextWeight);
      break;
    case "segment":
      s.segmentRounds = s.segmentTokens = s.segmentProbes = 0;
      break;
    case "info":
      if (event.forwardMs > 0) s.forward.add(s.forward.meanX(), event.forwardMs); // (at no known k: the level)
      if (event.streamMs > 0 || event.decodeMs > 0) s.replicaStream = Math.max(event.streamMs, event.decodeMs);
      if (event.rttMs !== null) {
        s.rtt = ewma(s.rtt, event.rttMs, config.memory);
        s.segmentProbes += 1;
      }
      break;
    case "round":
      observeRound(s, config, event);
      break;
    case "first_token": {
      const step = s.replicaStream ?? s.forward.at(1);
      if (s.rtt !== null && step !== null) s.prefill = ewma(s.prefill, Math.max(event.ms - s.rtt - step, 0), config.memory);
      break;
    }
    case "streamed":
      s.segmentTokens = event.tokens;
      if (event.tokens > 0) s.stream = event.ms / event.tokens;
      break;
    case "shadowed":
      if (event.afterGap) replayed(s, s.replay.restart());
      replayed(s, s.replay.feed(event.chances));
      if (event.draftMs !== null && event.chances.length > 0) s.shadowMs = ewma(s.shadowMs, event.draftMs / event.chances.length, config.memory);
      break;
  }
}

/**
 * A segment's first round also carried the Open (the replica's prefill): its wait beyond a round
 * trip and a forward is what a switch pays; its times price no round.
 */
function observeRound(s: State, config: PlannerConfig, r: Extract<Event, { kind: "round" }>): void {
  s.acceptance.add(Math.min(Math.max(r.tokens - 1, 0), r.k), r.k);
  s.segmentRounds += 1;
  if (s.segmentRounds === 1) {
    if (r.waitMs !== null && s.rtt !== null) s.prefill = ewma(s.prefill, Math.max(r.waitMs - s.rtt - r.forwardMs, 0), config.memory);
    return;
  }
  const predicted = roundMs(s, config, r.k, r.waitMs === null); // (before this round's times move it)
  if (r.forwardMs > 0) s.forward.add(r.k, r.forwardMs);
  if (r.waitMs !== null) {
    s.rtt = ewma(s.rtt, Math.max(r.waitMs - r.forwardMs, 0), config.memory);
    s.device.add(r.k, Math.max(r.wallMs - r.waitMs, 0));
  }
  if (predicted) {
    // Like with like: a held round against a held one's price, a fresh one against a fresh one.
    const ratio = Math.min(Math.max(r.wallMs / predicted, 1 / config.biasLimit), config.biasLimit);
    s.bias = ewma(s.bias, ratio, config.memory);
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

/** (fresh, held) rounds of k drafts; null until the round trip and the forward are known. */
function costs(s: State, config: PlannerConfig, k: number): [number, number] | null {
  const forward = s.forward.at(k);
  if (s.rtt === null || forward === null) return null;
  const device = s.device.at(k) ?? 0; // (until a round measured it: the round trip dominates a first guess)
  const fresh = s.rtt + forward + device;
  const depth = depthFor(s, config, forward + device);
  return [fresh, depth > 1 ? Math.max(forward + device, fresh / depth) : fresh];
}

function depthFor(s: State, config: PlannerConfig, perBlock: number): number {
  if (s.sendAhead !== "auto") return Math.max(1, Math.floor(s.sendAhead));
  return Math.max(2, Math.min(config.maxDepth, 1 + Math.ceil((s.rtt ?? 0) / Math.max(perBlock, 1))));
}

function roundMs(s: State, config: PlannerConfig, k: number, held: boolean): number | null {
  const c = costs(s, config, k);
  return c === null ? null : held ? c[1] : c[0];
}

/** [best k, speculation's ms per token there with the bias, blocks in flight]. */
export function forecast(s: State, config: PlannerConfig): [number, number | null, number] {
  const [tokens, holds] = s.acceptance.tokensAndHolds(s.maxK);
  let best: [number, number, number] | null = null;
  for (let k = 1; k <= s.maxK; k++) {
    const c = costs(s, config, k);
    if (c === null) return [s.maxK, null, 1];
    const [fresh, held] = c;
    const device = s.device.at(k) ?? 0;
    const ahead = s.sendAhead !== 1 && held < fresh && (s.sendAhead !== "auto" || holds[k]! * (fresh - held) >= device);
    const round = ahead ? holds[k]! * held + (1 - holds[k]!) * fresh : fresh;
    const rate = round / tokens[k]!;
    if (best === null || rate < best[0]) {
      const forward = s.forward.at(k) ?? 0;
      best = [rate, k, ahead ? depthFor(s, config, forward + device) : 1];
    }
  }
  return [best![1], best![0] * s.bias, best![2]];
}

function shadowShare(s: State, config: PlannerConfig, stream: number): number {
  return !s.shadowMs ? 1 : Math.min(1, (config.shadowShare * stream) / s.shadowMs);
}

/** The stream's ms per token (measured, else the replica's, else a forward), plus the shadow's share. */
export function cloudMs(s: State, config: PlannerConfig): number | null {
  const stream = s.stream || s.replicaStream || s.forward.at(1);
  if (!stream) return null;
  return stream + shadowShare(s, config, stream) * (s.shadowMs ?? 0);
}

/** Whether the shadow runs over the stream's token at `position`. */
export function shadowWanted(s: State, config: PlannerConfig, position: number): boolean {
  const stream = s.stream || s.replicaStream;
  const share = !stream ? 1 : shadowShare(s, config, stream);
  const period = Math.ceil(config.shadowLook / share);
  return share >= 1 || position % period >= period - config.shadowLook;
}

/** A switch: the round trip that opens the other path and the replica's prefill. */
export function switchCostMs(s: State, config: PlannerConfig): number {
  const prefill = s.prefill ?? config.prefillForwards * (s.forward.at(1) ?? 0);
  return (s.rtt ?? 0) + prefill;
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
  if (spec === null || cloud === null) return [current, "nothing to compare"];
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
    // A hopeless draft would cost its second round (the first rides with the Open) and a switch.
    const fresh = roundMs(s, config, s.maxK, false) ?? 0;
    if (Math.max(fresh - cloud, 0) + switchCostMs(s, config) > config.exploreLoss * budget * cloud) {
      return ["cloud_only", "the shadow judges the draft: a wrong guess costs too much here"];
    }
    return ["speculative", "exploring the draft"];
  }
  if ((s.rtt ?? 0) + budget * spec <= budget * cloud) return ["speculative", "predicted"]; // (one more round trip to start)
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
