/**
 * The one retry decision (edge/transport.py's Retries): whether a failed attempt is tried again
 * (after how long, over which connection) or raised as a typed error. Progress (a committed
 * token) resets the count of consecutive failures.
 */

import {
  Code, DRAINING_MESSAGE, DRAINING_PATIENCE_S, DRAINING_RETRY_S, StatusError, isDrainingRefusal, isRetryable, typedError,
} from "./errors.js";

export const DEFAULT_TIMEOUT_S = 30; // per reply: no single verdict or message may take longer
export const DEFAULT_MAX_RETRIES = 3; // consecutive failed attempts (without progress) before giving up

/** Exponential backoff with jitter for the attempt-th consecutive failure (1-based). */
export function backoffS(attempt: number, base = 0.2, cap = 5): number {
  return Math.min(cap, base * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2);
}

/**
 * What to do after a failed attempt: wait `delayS`, then open again with every committed token;
 * with `reroute`, over a fresh connection (after a move, a draining refusal, or a full replica).
 */
export interface Retry {
  delayS: number;
  reroute: boolean;
  cause: "moved" | "draining" | "failure";
}

/** The replica said `draining` with its last answer: what it sent is committed; reopen elsewhere. */
export class ReplicaMoved extends StatusError {
  constructor() {
    super(Code.UNAVAILABLE, DRAINING_MESSAGE);
  }
}

export class Retries {
  failures = 0;
  private drainingSince: number | null = null;

  constructor(readonly maxRetries: number, private readonly clock: () => number = () => performance.now() / 1000) {}

  progress(): void {
    this.failures = 0;
    this.drainingSince = null;
  }

  /**
   * Throws the typed error when giving up. A move reopens at once and counts no failure; an Open
   * refused by a draining replica is tried again after a short pause for as long as a drain lasts.
   */
  decide(error: unknown): Retry {
    if (error instanceof ReplicaMoved) return { delayS: 0, reroute: true, cause: "moved" };
    if (isDrainingRefusal(error)) {
      const now = this.clock();
      this.drainingSince ??= now;
      if (now - this.drainingSince <= DRAINING_PATIENCE_S) {
        return { delayS: DRAINING_RETRY_S * (0.5 + Math.random() / 2), reroute: true, cause: "draining" };
      }
    }
    this.failures += 1;
    if (!isRetryable(error) || this.failures > this.maxRetries) throw typedError(error);
    const full = error instanceof StatusError && error.code === Code.RESOURCE_EXHAUSTED;
    return { delayS: backoffS(this.failures), reroute: full, cause: "failure" };
  }
}
