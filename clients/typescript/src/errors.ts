/**
 * edgespec's typed errors, mirroring the Python SDK's (edge/errors.py): one hierarchy whatever the
 * transport. A gRPC status c and a WebSocket close code 4000 + c map to the same class.
 *
 *     EdgespecError
 *     ├── ConnectionFailedError     the server could not be reached (after retries)
 *     ├── RequestTimeoutError       no reply within the timeout (after retries)
 *     ├── TokenizerMismatchError    draft and target tokenize differently
 *     ├── DraftIntegrityError       the draft's graph is not the file its manifest names
 *     ├── CancelledError            the caller's AbortSignal ended the generation
 *     └── ServerError               what the server answered (a status code)
 *         ├── InvalidRequestError       INVALID_ARGUMENT / OUT_OF_RANGE: fix the request
 *         ├── SessionStateError         FAILED_PRECONDITION: protocol misuse
 *         ├── AuthenticationError       UNAUTHENTICATED / PERMISSION_DENIED: a valid key or token
 *         ├── CapacityError             RESOURCE_EXHAUSTED: retry later
 *         └── InternalServerError       INTERNAL / UNKNOWN / anything else
 */

import type { Result } from "./types.js";

/** gRPC status codes (the numbers are the wire's: grpc-js `status`, WebSocket close 4000 + code). */
export enum Code {
  OK = 0,
  CANCELLED = 1,
  UNKNOWN = 2,
  INVALID_ARGUMENT = 3,
  DEADLINE_EXCEEDED = 4,
  NOT_FOUND = 5,
  ALREADY_EXISTS = 6,
  PERMISSION_DENIED = 7,
  RESOURCE_EXHAUSTED = 8,
  FAILED_PRECONDITION = 9,
  ABORTED = 10,
  OUT_OF_RANGE = 11,
  UNIMPLEMENTED = 12,
  INTERNAL = 13,
  UNAVAILABLE = 14,
  DATA_LOSS = 15,
  UNAUTHENTICATED = 16,
}

/** A WebSocket close code that carries a status: 4000 + the gRPC code (docs/protocol.md). */
export const WS_STATUS_BASE = 4000;

export class EdgespecError extends Error {
  /** When a generation fails midway: what was committed before the error (finishReason "error"). */
  partial: Result | null = null;

  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

export class ConnectionFailedError extends EdgespecError {}
export class RequestTimeoutError extends EdgespecError {}
export class CancelledError extends EdgespecError {}

export class TokenizerMismatchError extends EdgespecError {
  constructor(readonly draftFingerprint: string, readonly serverFingerprint: string) {
    super(`tokenizer mismatch: the draft's tokenizer is '${draftFingerprint}' but the server's target uses ` +
      `'${serverFingerprint}'; export the draft with the target's tokenizer`);
  }
}

/** A draft's graph is not the file its manifest was written for: re-export or re-download it. */
export class DraftIntegrityError extends EdgespecError {}

export class ServerError extends EdgespecError {
  constructor(readonly code: Code, readonly details: string) {
    super(`${Code[code] ?? code}: ${details}`);
  }

  /** The status's name, as the conformance kit and logs spell it ("RESOURCE_EXHAUSTED"). */
  get codeName(): string {
    return Code[this.code] ?? String(this.code);
  }
}

export class InvalidRequestError extends ServerError {}
export class SessionStateError extends ServerError {}
export class CapacityError extends ServerError {}
export class AuthenticationError extends ServerError {}
export class InternalServerError extends ServerError {}

const BY_CODE: Partial<Record<Code, new (code: Code, details: string) => ServerError>> = {
  [Code.INVALID_ARGUMENT]: InvalidRequestError,
  [Code.OUT_OF_RANGE]: InvalidRequestError,
  [Code.FAILED_PRECONDITION]: SessionStateError,
  [Code.RESOURCE_EXHAUSTED]: CapacityError,
  [Code.UNAUTHENTICATED]: AuthenticationError,
  [Code.PERMISSION_DENIED]: AuthenticationError,
};

/** What a replica that Serve is stopping answers with UNAVAILABLE (cloud/serving/drain.py). */
export const DRAINING_MESSAGE =
  "this replica is shutting down (scale-down or redeploy): open a new session with every committed token; " +
  "another replica takes it";
/** An Open refused by a draining replica is tried again after about this long, for at most DRAINING_PATIENCE_S. */
export const DRAINING_RETRY_S = 0.1;
export const DRAINING_PATIENCE_S = 30;

/** Worth a new attempt (a new session resumed from the committed tokens). */
export const RETRYABLE_CODES: ReadonlySet<Code> = new Set([
  Code.UNAVAILABLE, Code.CANCELLED, Code.DEADLINE_EXCEEDED, Code.RESOURCE_EXHAUSTED,
  Code.INTERNAL, Code.UNKNOWN, Code.ABORTED,
]);

/**
 * A status as a transport reports it, before the retry decision types it (grpc's RpcError in
 * the Python SDK): a gRPC status, a WebSocket close 4000 + code, or a stream that ended early.
 */
export class StatusError extends Error {
  constructor(readonly code: Code, readonly details: string) {
    super(`${Code[code] ?? code}: ${details}`);
    this.name = "StatusError";
  }
}

/** No reply within the per-message timeout (retryable, like asyncio's TimeoutError). */
export class ReplyTimeout extends Error {
  constructor(readonly timeoutS: number) {
    super(`no reply within ${timeoutS}s`);
    this.name = "ReplyTimeout";
  }
}

/** The ServerError subclass for a status code. */
export function statusError(code: Code, details: string): ServerError {
  const Class = BY_CODE[code] ?? InternalServerError;
  return new Class(code, details);
}

/** The SDK's error for a status a transport reported (as edge/errors.py's from_rpc_error). */
export function fromStatus(code: Code, details: string): EdgespecError {
  if (code === Code.UNAVAILABLE) return new ConnectionFailedError(`server unavailable: ${details}`);
  if (code === Code.DEADLINE_EXCEEDED) return new RequestTimeoutError(`request timed out: ${details}`);
  return statusError(code, details);
}

/** The typed error for anything a failed attempt raised. */
export function typedError(error: unknown): EdgespecError {
  if (error instanceof EdgespecError) return error;
  if (error instanceof ReplyTimeout) return new RequestTimeoutError(error.message);
  if (error instanceof StatusError) return fromStatus(error.code, error.details);
  return statusError(Code.UNKNOWN, error instanceof Error ? error.message : String(error));
}

export function isRetryable(error: unknown): boolean {
  if (error instanceof ReplyTimeout) return true;
  return error instanceof StatusError && RETRYABLE_CODES.has(error.code);
}

/**
 * An UNAVAILABLE from a replica that is shutting down (its message says so). Over WebSocket the
 * message is a close reason, cut to 123 bytes: a long enough start of it counts.
 */
export function isDrainingRefusal(error: unknown): boolean {
  if (!(error instanceof StatusError) || error.code !== Code.UNAVAILABLE) return false;
  const details = error.details;
  return details.startsWith(DRAINING_MESSAGE) || (details.length >= 64 && DRAINING_MESSAGE.startsWith(details));
}

/** The status a WebSocket close code carries: 4000 + c is status c; 1000 a normal end; others a broken link. */
export function statusFromClose(closeCode: number, reason: string): StatusError | null {
  if (closeCode >= WS_STATUS_BASE && closeCode <= WS_STATUS_BASE + Code.UNAUTHENTICATED) {
    return new StatusError(closeCode - WS_STATUS_BASE as Code, reason);
  }
  if (closeCode === 1000) return null;
  return new StatusError(Code.UNAVAILABLE, `the WebSocket closed with ${closeCode}${reason ? `: ${reason}` : ""}`);
}
