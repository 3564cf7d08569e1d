/**
 * The browser example: loads a draft with ONNX Runtime Web (WASM) and generates over the
 * WebSocket transport. Query parameters: `draft` (the draft directory's URL, default ./draft/),
 * `ort` (where ONNX Runtime Web's .wasm/.mjs files are, default ./ort/), `server` (ws:// or
 * wss:// address of the verifier's WebSocket route), `token` (a short-lived token minted by
 * your backend, never a key: a page's source is public).
 *
 * `window.edgespec` exposes the loaded draft, the model module and `generate`, for scripts and
 * the headless-Chromium test (test/browser).
 */

import * as ort from "onnxruntime-web/wasm";

import { EdgeClient, type RequestOptions, type Result } from "../../src/index.js";
import * as model from "../../src/model/index.js";

const params = new URLSearchParams(location.search);
const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;

ort.env.wasm.wasmPaths = new URL(params.get("ort") ?? "./ort/", location.href).href;
ort.env.wasm.numThreads = 1; // threads need a cross-origin-isolated page (COOP/COEP headers)

async function start() {
  const draft = await model.loadDraft({ ort, source: new URL(params.get("draft") ?? "./draft/", location.href).href });
  let client: EdgeClient | null = null;

  /** Generates `prompt` (text or ids) against the verifier at `server`; `onText` gets each streamed piece. */
  async function generate(server: string, prompt: string | number[], options: RequestOptions = {},
                          onText?: (piece: string) => void): Promise<Result> {
    client ??= await EdgeClient.connect(server, { draft, apiKey: params.get("token") ?? undefined });
    if (!onText) return client.generate(prompt, options);
    const stream = client.stream(prompt, options);
    for await (const piece of stream) onText(piece);
    return stream.result!;
  }

  Object.assign(globalThis, { edgespec: { draft, model, generate } });
  const button = $<HTMLButtonElement>("generate");
  const stop = $<HTMLButtonElement>("stop");
  $<HTMLInputElement>("server").value = params.get("server") ?? "";
  $("status").textContent = `draft ready: ${draft.manifest.architecture}, ${draft.vocabSize} tokens, ${draft.tokenizerFingerprint}`;
  button.disabled = false;
  button.onclick = async () => {
    const output = $("output");
    output.textContent = "";
    const abort = new AbortController();
    stop.disabled = false;
    stop.onclick = () => abort.abort();
    button.disabled = true;
    try {
      const result = await generate($<HTMLInputElement>("server").value, $<HTMLTextAreaElement>("prompt").value,
        { maxNewTokens: 64, temperature: 0, signal: abort.signal }, (piece) => (output.textContent += piece));
      $("status").textContent = `${result.tokenIds.length} tokens, ${result.finishReason}`;
    } catch (error) {
      $("status").textContent = String(error);
    } finally {
      button.disabled = false;
      stop.disabled = true;
    }
  };
  document.body.dataset.ready = "true";
}

start().catch((error) => {
  $("status").textContent = `failed: ${error}`;
  document.body.dataset.ready = "error";
  document.body.dataset.error = String(error);
});
