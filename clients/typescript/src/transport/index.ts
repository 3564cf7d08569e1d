/** The transport for an address: the URL scheme says which (ws/wss/http/https: WebSocket; else gRPC). */

import type { ConnectOptions, Transport } from "./types.js";

export type { ConnectOptions, GenerateStream, SessionStream, Transport } from "./types.js";

export function isWebSocketAddress(address: string): boolean {
  return /^(wss?|https?):\/\//.test(address);
}

/**
 * A transport for `address`: `ws://`, `wss://`, `http://` or `https://` take the WebSocket
 * transport (browsers and React Native must); `host:port`, `grpc://` and `grpcs://` gRPC (Node,
 * Electron). gRPC is imported only when used, so a browser bundle need not carry it.
 */
export async function connect(address: string, options: ConnectOptions = {}): Promise<Transport> {
  if (isWebSocketAddress(address)) {
    const { WebSocketTransport, platformSockets } = await import("./websocket.js");
    return new WebSocketTransport(address, await platformSockets(), options);
  }
  const { GrpcTransport } = await import("./grpc.js");
  return new GrpcTransport(address, options);
}
