/**
 * The Session as binary WebSocket frames (docs/protocol.md, "WebSocket transport"): browsers and
 * React Native (their global WebSocket) and Node (the `ws` package), one code base.
 *
 *     ws(s)://HOST:PORT/<prefix>/v1/session   one frame = one SessionRequest / SessionResponse
 *     GET http(s)://HOST:PORT/<prefix>/v1/info   the InfoResponse as binary protobuf
 *
 * Credentials: the subprotocol `edgespec.auth.<key or token>` beside `edgespec.v1` (all a browser
 * can set on a WebSocket), or, from Node, `authorization: Bearer` on the upgrade. The server ends
 * a session with close code 1000 (normal) or 4000 + a gRPC status code, its details as the reason.
 * Cloud-only Generate goes to `<prefix>/v1/generate` (one GenerateRequest frame, then one frame
 * per GenerateResponse), where the server serves it.
 */

import { Code, StatusError, statusFromClose } from "../errors.js";
import {
  type GenerateRequest, type GenerateResponse, type InfoResponse, type SessionResponse,
  decodeGenerateResponse, decodeInfoResponse, decodeSessionResponse, encodeGenerateRequest,
} from "../wire.js";
import { MessageQueue } from "./queue.js";
import type { ConnectOptions, GenerateStream, SessionStream, Transport } from "./types.js";

export const SUBPROTOCOL = "edgespec.v1";
export const AUTH_SUBPROTOCOL = "edgespec.auth.";
const CREDENTIAL = /^[A-Za-z0-9._~-]+$/;
const HTTP_TO_CODE: Record<number, Code> = { 400: Code.INVALID_ARGUMENT, 401: Code.UNAUTHENTICATED, 403: Code.PERMISSION_DENIED, 404: Code.UNIMPLEMENTED, 429: Code.RESOURCE_EXHAUSTED };

/** The part of the WebSocket API both the browser's and `ws`'s objects have. */
interface Socket {
  binaryType: string;
  readonly readyState: number;
  onopen: ((event: unknown) => void) | null;
  onmessage: ((event: { data: unknown }) => void) | null;
  onclose: ((event: { code: number; reason: string }) => void) | null;
  onerror: ((event: unknown) => void) | null;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
}
/** Makes a socket: (url, subprotocols, headers: Node only). */
export type SocketFactory = (url: string, protocols: string[], headers: Record<string, string>) => Socket;

const OPEN = 1;

/** A Node process (not a browser, not React Native): the `ws` package, with headers. */
function isNode(): boolean {
  const proc = (globalThis as { process?: { versions?: { node?: string } } }).process;
  return typeof proc?.versions?.node === "string" && typeof (globalThis as { window?: unknown }).window === "undefined";
}

/** The platform's WebSocket: the global one (browsers, React Native, Node >= 22), else `ws` in Node. */
export async function platformSockets(): Promise<SocketFactory> {
  if (isNode()) {
    const { WebSocket } = await import("ws");
    return (url, protocols, headers) => new WebSocket(url, protocols, { headers }) as unknown as Socket;
  }
  const Global = (globalThis as { WebSocket?: new (url: string, protocols: string[]) => Socket }).WebSocket;
  if (Global === undefined) throw new Error("no WebSocket on this platform");
  return (url, protocols) => new Global(url, protocols);
}

function bytesOf(data: unknown): Uint8Array | null {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return null; // a text frame: not part of the protocol
}

/**
 * One socket carrying protobuf frames: what is sent before it opens waits for the open; what
 * arrives is queued; its close ends the queue with the status it carries.
 */
class FrameSocket<Out> {
  readonly queue = new MessageQueue<Out>();
  private readonly pending: Uint8Array[] = [];
  private readonly socket: Socket;

  constructor(sockets: SocketFactory, url: string, protocols: string[], headers: Record<string, string>,
              decode: (bytes: Uint8Array) => Out) {
    this.socket = sockets(url, protocols, headers);
    this.socket.binaryType = "arraybuffer";
    this.socket.onopen = () => {
      for (const frame of this.pending.splice(0)) this.socket.send(frame);
    };
    this.socket.onmessage = (event) => {
      const bytes = bytesOf(event.data);
      if (bytes === null) return this.fail(new StatusError(Code.INTERNAL, "the server sent a text frame"));
      try {
        this.queue.push(decode(bytes));
      } catch (error) {
        this.fail(new StatusError(Code.INTERNAL, `a frame that is not the message: ${(error as Error).message}`));
      }
    };
    this.socket.onclose = (event) => this.queue.end(statusFromClose(event.code, event.reason));
    this.socket.onerror = () => {
      // (a close event follows; where the upgrade was refused it carries 1006, read as UNAVAILABLE)
    };
  }

  send(bytes: Uint8Array): void {
    const ended = this.queue.endStatus;
    if (ended !== undefined) throw ended ?? new StatusError(Code.UNAVAILABLE, "the WebSocket has closed");
    if (this.socket.readyState === OPEN) this.socket.send(bytes);
    else this.pending.push(bytes);
  }

  fail(status: StatusError): void {
    this.queue.end(status);
    this.close();
  }

  close(): void {
    try {
      this.socket.close(1000);
    } catch {
      // (already closing)
    }
  }
}

class WsSessionStream implements SessionStream {
  constructor(private readonly frames: FrameSocket<SessionResponse>) {}

  send(frame: Uint8Array): void {
    this.frames.send(frame);
  }

  receive(timeoutS: number): Promise<SessionResponse> {
    return this.frames.queue.nextOrFail(timeoutS);
  }

  doneWriting(): void {
    // (a WebSocket has no half-close: after Close the server sends Closed and closes with 1000)
  }

  cancel(): void {
    this.frames.queue.end(new StatusError(Code.CANCELLED, "cancelled by the client"));
    this.frames.close();
  }
}

class WsGenerateStream implements GenerateStream {
  constructor(private readonly frames: FrameSocket<GenerateResponse>) {}

  next(timeoutS: number): Promise<GenerateResponse | null> {
    return this.frames.queue.next(timeoutS);
  }

  cancel(): void {
    this.frames.queue.end(new StatusError(Code.CANCELLED, "cancelled by the client"));
    this.frames.close();
  }
}

/** The base URL's WebSocket and HTTP forms: ws://h:p/prefix and http://h:p/prefix, no trailing slash. */
export function websocketBases(url: string): { ws: string; http: string } {
  const parsed = new URL(url);
  const secure = parsed.protocol === "wss:" || parsed.protocol === "https:";
  const rest = `//${parsed.host}${parsed.pathname.replace(/\/+$/, "")}`;
  return { ws: `${secure ? "wss" : "ws"}:${rest}`, http: `${secure ? "https" : "http"}:${rest}` };
}

export class WebSocketTransport implements Transport {
  readonly kind = "websocket";
  private readonly bases: { ws: string; http: string };
  private readonly protocols: string[];
  private readonly headers: Record<string, string>;

  constructor(url: string, private readonly sockets: SocketFactory, options: ConnectOptions = {}, node = isNode()) {
    this.bases = websocketBases(url);
    this.protocols = [SUBPROTOCOL];
    this.headers = {};
    const key = options.apiKey;
    if (key) {
      if (node) this.headers.authorization = `Bearer ${key}`;
      else if (CREDENTIAL.test(key)) this.protocols.push(AUTH_SUBPROTOCOL + key);
      else throw new RangeError("an API key or token sent from a browser must be made of [A-Za-z0-9._~-]");
    }
  }

  private frames<Out>(path: string, decode: (bytes: Uint8Array) => Out): FrameSocket<Out> {
    return new FrameSocket(this.sockets, this.bases.ws + path, this.protocols, this.headers, decode);
  }

  session(): SessionStream {
    return new WsSessionStream(this.frames("/v1/session", decodeSessionResponse));
  }

  generate(request: GenerateRequest): GenerateStream {
    const frames = this.frames("/v1/generate", decodeGenerateResponse);
    frames.send(encodeGenerateRequest(request));
    return new WsGenerateStream(frames);
  }

  async info(timeoutS: number): Promise<InfoResponse> {
    const headers: Record<string, string> = {};
    if (this.headers.authorization) headers.authorization = this.headers.authorization;
    else {
      const auth = this.protocols.find((p) => p.startsWith(AUTH_SUBPROTOCOL));
      if (auth) headers.authorization = `Bearer ${auth.slice(AUTH_SUBPROTOCOL.length)}`;
    }
    let reply: Response;
    try {
      reply = await fetch(`${this.bases.http}/v1/info`, { headers, signal: AbortSignal.timeout(timeoutS * 1000) });
    } catch (error) {
      const timedOut = (error as Error).name === "TimeoutError";
      throw new StatusError(timedOut ? Code.DEADLINE_EXCEEDED : Code.UNAVAILABLE, `GET /v1/info: ${(error as Error).message}`);
    }
    if (!reply.ok) {
      const grpcStatus = Number(reply.headers.get("grpc-status") ?? NaN);
      const code = Number.isInteger(grpcStatus) ? grpcStatus as Code : HTTP_TO_CODE[reply.status] ?? Code.UNAVAILABLE;
      throw new StatusError(code, `GET /v1/info: HTTP ${reply.status} ${(await reply.text()).slice(0, 200)}`);
    }
    return decodeInfoResponse(new Uint8Array(await reply.arrayBuffer()));
  }

  reconnect(): void {
    // (every WebSocket session is a connection of its own: the next one goes through the ingress afresh)
  }

  close(): void {}
}
