/**
 * gRPC over HTTP/2 (@grpc/grpc-js): Node and Electron's main process. The API key goes in every
 * call's metadata as `authorization: Bearer <key>`. Browsers and React Native cannot speak it:
 * they take the WebSocket transport (websocket.ts), which carries the same messages.
 */

import * as grpc from "@grpc/grpc-js";
import { Code, StatusError } from "../errors.js";
import {
  type GenerateRequest, type GenerateResponse, type InfoResponse, type SessionResponse,
  decodeGenerateResponse, decodeInfoResponse, decodeSessionResponse, encodeGenerateRequest, encodeInfoRequest,
} from "../wire.js";
import { MessageQueue } from "./queue.js";
import type { ConnectOptions, GenerateStream, SessionStream, Transport } from "./types.js";

const SERVICE = "/edgespec.v1.Speculative/";
const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  "grpc.keepalive_time_ms": 30_000,
  "grpc.keepalive_timeout_ms": 10_000,
  "grpc.max_receive_message_length": 16 * 1024 * 1024,
};
/** A retired connection (after `reconnect`) is closed this long after: streams on it may still run. */
const RETIRE_AFTER_MS = 120_000;

const identity = (bytes: Uint8Array): Buffer => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);

function statusOf(error: Partial<grpc.ServiceError>): StatusError {
  const code = typeof error.code === "number" ? error.code as number as Code : Code.UNKNOWN;
  return new StatusError(code, error.details ?? error.message ?? "");
}

class GrpcSessionStream implements SessionStream {
  private readonly queue = new MessageQueue<SessionResponse>();

  constructor(private readonly call: grpc.ClientDuplexStream<Uint8Array, SessionResponse>) {
    call.on("data", (message: SessionResponse) => this.queue.push(message));
    call.on("error", (error: grpc.ServiceError) => this.queue.end(statusOf(error)));
    call.on("status", (status: grpc.StatusObject) => {
      this.queue.end(status.code === grpc.status.OK ? null : statusOf(status));
    });
  }

  send(frame: Uint8Array): void {
    const ended = this.queue.endStatus;
    if (ended !== undefined) throw ended ?? new StatusError(Code.UNAVAILABLE, "the session stream has ended");
    this.call.write(frame);
  }

  receive(timeoutS: number): Promise<SessionResponse> {
    return this.queue.nextOrFail(timeoutS);
  }

  doneWriting(): void {
    this.call.end();
  }

  cancel(): void {
    this.call.cancel();
  }
}

class GrpcGenerateStream implements GenerateStream {
  private readonly queue = new MessageQueue<GenerateResponse>();

  constructor(private readonly call: grpc.ClientReadableStream<GenerateResponse>) {
    call.on("data", (message: GenerateResponse) => this.queue.push(message));
    call.on("error", (error: grpc.ServiceError) => this.queue.end(statusOf(error)));
    call.on("status", (status: grpc.StatusObject) => {
      this.queue.end(status.code === grpc.status.OK ? null : statusOf(status));
    });
  }

  next(timeoutS: number): Promise<GenerateResponse | null> {
    return this.queue.next(timeoutS);
  }

  cancel(): void {
    this.call.cancel();
  }
}

/** `host:port`, `grpc://host:port` or `grpcs://host:port` (TLS). */
export function grpcTarget(address: string): { target: string; tls: boolean } {
  const match = /^(grpcs?):\/\/(.*?)\/?$/.exec(address);
  if (match) return { target: match[2]!, tls: match[1] === "grpcs" };
  return { target: address, tls: false };
}

export class GrpcTransport implements Transport {
  readonly kind = "grpc";
  private client: grpc.Client;
  private readonly metadata = new grpc.Metadata();
  private readonly credentials: grpc.ChannelCredentials;
  private readonly target: string;
  private readonly retired = new Set<grpc.Client>();

  constructor(address: string, options: ConnectOptions = {}) {
    const { target, tls } = grpcTarget(address);
    this.target = target;
    if (options.caCert !== undefined && !(tls || options.tls)) {
      throw new RangeError("caCert is for TLS connections: pass tls: true (or a grpcs:// address) as well");
    }
    const roots = typeof options.caCert === "string" ? Buffer.from(options.caCert) : options.caCert ? Buffer.from(options.caCert) : null;
    this.credentials = tls || options.tls ? grpc.credentials.createSsl(roots) : grpc.credentials.createInsecure();
    if (options.apiKey) this.metadata.set("authorization", `Bearer ${options.apiKey}`);
    this.client = this.connect();
  }

  private connect(): grpc.Client {
    return new grpc.Client(this.target, this.credentials, CHANNEL_OPTIONS);
  }

  session(): SessionStream {
    const call = this.client.makeBidiStreamRequest(
      `${SERVICE}Session`, identity, decodeSessionResponse, this.metadata);
    return new GrpcSessionStream(call);
  }

  generate(request: GenerateRequest): GenerateStream {
    const call = this.client.makeServerStreamRequest(
      `${SERVICE}Generate`, (m: GenerateRequest) => identity(encodeGenerateRequest(m)), decodeGenerateResponse, request,
      this.metadata);
    return new GrpcGenerateStream(call);
  }

  info(timeoutS: number): Promise<InfoResponse> {
    return new Promise((resolve, reject) => {
      this.client.makeUnaryRequest(
        `${SERVICE}Info`, () => identity(encodeInfoRequest()), decodeInfoResponse, {}, this.metadata,
        { deadline: Date.now() + timeoutS * 1000 },
        (error, reply) => (error || !reply ? reject(statusOf(error ?? {})) : resolve(reply)));
    });
  }

  reconnect(): void {
    // A drained replica's old ingress connection may route to it again: later calls take a new
    // one; streams still on the old one go on until it is closed.
    const old = this.client;
    this.client = this.connect();
    this.retired.add(old);
    setTimeout(() => {
      if (this.retired.delete(old)) old.close();
    }, RETIRE_AFTER_MS).unref?.();
  }

  close(): void {
    for (const client of this.retired) client.close();
    this.retired.clear();
    this.client.close();
  }
}
