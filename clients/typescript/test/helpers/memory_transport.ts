/** A transport whose other end is a FakeVerifier in the same process (no sockets). */

import { Code, StatusError } from "../../src/errors.js";
import { MessageQueue } from "../../src/transport/queue.js";
import type { GenerateStream, SessionStream, Transport } from "../../src/transport/types.js";
import { create } from "@bufbuild/protobuf";
import { GenerateResponseSchema } from "../../src/gen/edgespec/v1/speculative_pb.js";
import { decodeSessionRequest, type GenerateRequest, type GenerateResponse, type InfoResponse, type SessionRequest, type SessionResponse } from "../../src/wire.js";
import { DRAINING_MESSAGE } from "../../src/errors.js";
import type { FakeVerifier, Script } from "./fake_verifier.js";

export class MemoryTransport implements Transport {
  readonly kind = "memory";
  reconnects = 0;
  generateCalls = 0;

  constructor(private readonly verifier: FakeVerifier, private readonly script: Script = {}) {}

  session(): SessionStream {
    const play = this.verifier.session();
    const queue = new MessageQueue<SessionResponse>();
    const script = this.script;
    return {
      send(frame: Uint8Array) {
        const message: SessionRequest = decodeSessionRequest(frame);
        if (queue.isEnded) throw queue.endStatus ?? new StatusError(Code.UNAVAILABLE, "ended");
        // (replies arrive on a later tick, as from a socket)
        setTimeout(() => {
          try {
            for (const reply of play(message)) {
              if (reply === null) {
                const status = script.draining ? new StatusError(Code.UNAVAILABLE, DRAINING_MESSAGE) : new StatusError(script.cutCode ?? Code.UNAVAILABLE, "scripted cut");
                queue.end(status);
                return;
              }
              queue.push(reply);
              if (reply.kind.case === "closed") queue.end(null);
            }
          } catch (error) {
            queue.end(error as StatusError);
          }
        }, 0);
      },
      receive: (timeoutS: number) => queue.nextOrFail(timeoutS),
      doneWriting() {},
      cancel() {
        queue.end(new StatusError(Code.CANCELLED, "cancelled"));
      },
    };
  }

  generate(request: GenerateRequest): GenerateStream {
    this.generateCalls += 1;
    const queue = new MessageQueue<GenerateResponse>();
    const replies = this.verifier.generate(request.promptIds, request.maxNewTokens);
    setTimeout(() => {
      for (const reply of replies) queue.push(create(GenerateResponseSchema, reply));
      queue.end(null);
    }, 0);
    return { next: (timeoutS: number) => queue.next(timeoutS), cancel: () => queue.end(new StatusError(Code.CANCELLED, "cancelled")) };
  }

  async info(): Promise<InfoResponse> {
    return this.verifier.info();
  }

  reconnect(): void {
    this.reconnects += 1;
  }

  close(): void {}
}
