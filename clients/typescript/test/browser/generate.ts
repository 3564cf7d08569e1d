// Generation in the browser example, against a verifier, for tests/clients/test_browser.py:
//   tsx test/browser/generate.ts --page URL --server ws://HOST:PORT --prompts FILE.jsonl --max-new-tokens N [--k K] [--timeout-s S]
// FILE.jsonl: {"id", "prompt_ids"} per line. Prints {"id", "token_ids", "finish_reason", "rounds"} per prompt.
import { readFileSync } from "node:fs";

import { openPage, watchdog } from "./page.js";

const args = process.argv.slice(2);
const option = (name: string, fallback?: string): string => {
  const at = args.indexOf(name);
  if (at >= 0) return args[at + 1];
  if (fallback === undefined) throw new Error(`${name} is required`);
  return fallback;
};
const k = option("--k", "auto");
const options = { maxNewTokens: Number(option("--max-new-tokens")), stopTokenIds: [], k: k === "auto" ? "auto" : Number(k) };
const prompts = readFileSync(option("--prompts"), "utf8").split("\n").filter(Boolean).map((line) => JSON.parse(line));

watchdog(Number(option("--timeout-s", "500")) * 1000, () => {});
const { browser, page } = await openPage(option("--page"));
try {
  for (const { id, prompt_ids: promptIds } of prompts) {
    const result = await page.evaluate(async ({ server, promptIds, options }) => {
      const { generate } = (globalThis as unknown as { edgespec: { generate: Function } }).edgespec;
      const r = await generate(server, promptIds, options);
      return { token_ids: r.tokenIds, finish_reason: r.finishReason, rounds: r.rounds.length, text: r.text };
    }, { server: option("--server"), promptIds, options });
    console.log(JSON.stringify({ id, ...result }));
  }
} finally {
  await browser.close();
}
