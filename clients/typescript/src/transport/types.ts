/**
 * What the generation loop needs of a transport (gRPC over HTTP/2, or WebSocket): one Session
 * stream, one Generate stream, Info. No algorithm here; every failure is a StatusError (a status
 * code with its details) or a ReplyTimeout, and the retry decision (retries.ts) types it.
 */

import type { GenerateRequest, GenerateResponse, InfoResponse, SessionResponse } from "../wire.js";

/** One bidirectional Session stream. */
export interface SessionStream {
  /** Queues one serialized SessionRequest (the stream keeps send order). Throws a StatusError once the stream has ended. */
  send(frame: Uint8Array): void;
  /** The next message; rejects with the stream's StatusError when it ends (an end without one reads UNAVAILABLE). */
  receive(timeoutS: number): Promise<SessionResponse>;
  /** Half-closes: no more messages from this side. */
  doneWriting(): void;
  /** Ends the stream at once (the server frees the session). */
  cancel(): void;
}

/** One Generate call's replies, in order. */
export interface GenerateStream {
  /** The next reply, or null after the last; rejects with a StatusError. */
  next(timeoutS: number): Promise<GenerateResponse | null>;
  cancel(): void;
}

export interface Transport {
  /** "grpc" or "websocket". */
  readonly kind: string;
  session(): SessionStream;
  generate(request: GenerateRequest): GenerateStream;
  info(timeoutS: number): Promise<InfoResponse>;
  /** Later calls go over a fresh connection (another replica should take the session). */
  reconnect(): void;
  close(): void;
}

/** Where and how to connect: what every transport takes. */
export interface ConnectOptions {
  /** An API key or a short-lived token (`edgespec keys mint`); sent as `authorization: Bearer` (or the auth subprotocol in browsers). */
  apiKey?: string;
  /** gRPC: connect with TLS (a `grpcs://` address says so too). */
  tls?: boolean;
  /** gRPC with TLS: PEM of the CA that signed the server's certificate (default: the system's roots). */
  caCert?: Uint8Array | string;
}
