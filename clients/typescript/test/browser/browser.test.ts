import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import type { Browser, Page } from "playwright-core";

import { DEMO_DRAFT, pythonReference } from "../model/reference.js";
import { replayScript } from "../model/script.js";
import { buildExample, openPage, serveExample, watchdog } from "./page.js";

interface DraftReference {
  script: [string, unknown][];
  runs: { prompt_ids: number[]; results: unknown[]; tokens: number[] }[];
}

describe("the browser example in headless Chromium: the demo draft in ONNX Runtime Web (WASM)", { timeout: 300_000 }, () => {
  let browser: Browser | undefined;
  let page: Page;
  let stop = () => {};

  before(async () => {
    watchdog(400_000, () => stop());
    await buildExample();
    const { url, server } = await serveExample(DEMO_DRAFT);
    stop = () => server.kill();
    try {
      ({ browser, page } = await openPage(url));
    } catch (error) {
      stop();
      throw error;
    }
  });

  after(async () => {
    await browser?.close();
    stop();
  });

  it("drafts the Python draft's tokens (greedy, lookup, observe, coupled, with rollbacks)", async () => {
    const reference = await pythonReference<DraftReference>("draft", DEMO_DRAFT);
    const runs = await page.evaluate(async ({ source, script, prompts }) => {
      const replay = (0, eval)(`(${source})`);
      const { draft, model } = (globalThis as unknown as { edgespec: { draft: unknown; model: unknown } }).edgespec;
      return replay(draft, model, script, prompts);
    }, { source: replayScript.toString(), script: reference.script, prompts: reference.runs.map((run) => run.prompt_ids) });
    assert.equal(runs.length, reference.runs.length);
    runs.forEach((run: { results: unknown[]; tokens: number[] }, i: number) => {
      run.results.forEach((result, j) => assert.deepEqual(result, reference.runs[i].results[j], `run ${i} step ${j}`));
      assert.deepEqual(run.tokens, reference.runs[i].tokens);
    });
  });

  it("checked the graph's hash and the tokenizer's fingerprint in the page (WebCrypto)", async () => {
    const fingerprint = await page.evaluate(() => (globalThis as unknown as { edgespec: { draft: { tokenizer: { fingerprint(): Promise<string> } } } }).edgespec.draft.tokenizer.fingerprint());
    assert.equal(fingerprint, "tok1-bpe-4096-4b9b3d3517fbfa0a");
  });
});
