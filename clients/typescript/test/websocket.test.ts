/**
 * The WebSocket transport against a local server speaking docs/protocol.md's WebSocket form
 * (binary frames, subprotocol edgespec.v1, close 4000 + code, GET /v1/info).
 */

import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import { toBinary } from "@bufbuild/protobuf";
import { WebSocketServer } from "ws";
import { EdgeClient } from "../src/client.js";
import { AuthenticationError, Code, InvalidRequestError, StatusError, WS_STATUS_BASE } from "../src/errors.js";
import { InfoResponseSchema, SessionResponseSchema } from "../src/gen/edgespec/v1/speculative_pb.js";
import { isWebSocketAddress } from "../src/transport/index.js";
import { WebSocketTransport, websocketBases } from "../src/transport/websocket.js";
import { decodeSessionRequest } from "../src/wire.js";
import { OracleDrafter, targetOutput } from "./helpers/drafters.js";
import { FakeVerifier, type Script } from "./helpers/fake_verifier.js";

const KEY = "est1.abc-DEF_123~x";
let server: Server;
let base = "";
let verifier: FakeVerifier;
let script: Script = {};
const upgrades: Array<{ protocols: string; authorization?: string; path: string }> = [];

before(async () => {
  server = createServer((request, response) => {
    if (request.url !== "/pre/v1/info") return void response.writeHead(404).end();
    if (request.headers.authorization !== `Bearer ${KEY}`) return void response.writeHead(401, { "grpc-status": "16" }).end("no key");
    response.writeHead(200, { "content-type": "application/x-protobuf" }).end(Buffer.from(toBinary(InfoResponseSchema, verifier.info())));
  });
  const sockets = new WebSocketServer({ server, handleProtocols: (offered) => (offered.has("edgespec.v1") ? "edgespec.v1" : false) });
  sockets.on("connection", (socket, request) => {
    upgrades.push({ protocols: String(request.headers["sec-websocket-protocol"]), authorization: request.headers.authorization, path: request.url ?? "" });
    if (request.headers.authorization !== `Bearer ${KEY}`) return socket.close(WS_STATUS_BASE + Code.UNAUTHENTICATED, "no credential");
    const play = verifier.session();
    socket.on("message", (data, isBinary) => {
      if (!isBinary) return socket.close(WS_STATUS_BASE + Code.INVALID_ARGUMENT, "text frame");
      try {
        for (const reply of play(decodeSessionRequest(new Uint8Array(data as Buffer)))) {
          if (reply === null) return socket.close(WS_STATUS_BASE + (script.cutCode ?? Code.UNAVAILABLE), "scripted cut");
          socket.send(toBinary(SessionResponseSchema, reply));
          if (reply.kind.case === "closed") socket.close(1000);
        }
      } catch (error) {
        const status = error as StatusError;
        socket.close(WS_STATUS_BASE + status.code, status.details);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `ws://127.0.0.1:${(server.address() as AddressInfo).port}/pre/`;
});

after(() => server.close());

async function generate(s: Script, apiKey = KEY) {
  script = s;
  verifier = new FakeVerifier(s);
  const client = await EdgeClient.connect(base, { draft: new OracleDrafter(1), apiKey, timeoutS: 5, maxRetries: 2 });
  try {
    return await client.generate([3, 4, 5], { maxNewTokens: 15, k: 3, sendAhead: 2, speculate: true });
  } finally {
    client.close();
  }
}

describe("the WebSocket transport", () => {
  it("is chosen by the URL's scheme, and finds /v1/session and /v1/info under the prefix", () => {
    assert.ok(isWebSocketAddress("ws://h:8000") && isWebSocketAddress("wss://h") && isWebSocketAddress("https://h/x"));
    assert.ok(!isWebSocketAddress("127.0.0.1:50051") && !isWebSocketAddress("grpcs://h:443"));
    assert.deepEqual(websocketBases("https://h:8000/app/"), { ws: "wss://h:8000/app", http: "https://h:8000/app" });
  });

  it("generates the target's output over binary frames, with the key on the upgrade", async () => {
    const result = await generate({});
    assert.deepEqual(result.tokenIds, targetOutput([3, 4, 5], 15));
    const upgrade = upgrades[upgrades.length - 1]!;
    assert.equal(upgrade.path, "/pre/v1/session");
    assert.match(upgrade.protocols, /edgespec\.v1/);
    assert.equal(upgrade.authorization, `Bearer ${KEY}`);
  });

  it("resumes after the server closes with 4014 (UNAVAILABLE)", async () => {
    const result = await generate({ cutAfter: 2 });
    assert.deepEqual(result.tokenIds, targetOutput([3, 4, 5], 15));
    assert.equal(result.stats.resumes, 1);
  });

  it("raises the typed error of a close 4000 + code without retrying what says not to", async () => {
    await assert.rejects(generate({ refuse: Code.INVALID_ARGUMENT }), InvalidRequestError);
    assert.equal(verifier.opens.length, 1);
    await assert.rejects(generate({}, "wrong"), AuthenticationError);
  });

  it("offers the credential as a subprotocol where it cannot set headers (browsers, React Native)", () => {
    let offered: string[] = [];
    const transport = new WebSocketTransport("wss://h/x", (_url, protocols) => {
      offered = protocols;
      return { binaryType: "", readyState: 0, onopen: null, onmessage: null, onclose: null, onerror: null, send() {}, close() {} };
    }, { apiKey: KEY }, false);
    transport.session();
    assert.deepEqual(offered, ["edgespec.v1", `edgespec.auth.${KEY}`]);
  });
});
