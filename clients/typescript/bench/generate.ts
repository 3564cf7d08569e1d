/**
 * The Node client over a list of prompts: each prompt's generated ids and time, as JSON lines on
 * stdout (scripts/bench_ts_client.py runs it beside the Python SDK on the same prompts, and
 * tests/clients/test_typescript.py compares its greedy output with the Python SDK's).
 *
 *     npx tsx bench/generate.ts --address 127.0.0.1:50051 --draft ../../models/demo/draft \
 *         --prompts prompts.jsonl [--max-new-tokens 64] [--k auto] [--warmup 1] [--temperature 0]
 *
 * prompts.jsonl: one {"id": ..., "prompt_ids": [...]} (or "prompt": text) per line. The draft
 * runs on one ONNX Runtime thread (onnxruntime-node).
 */

import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import * as ort from "onnxruntime-node";
import { EdgeClient, type RequestOptions } from "../src/index.js";
import { loadDraft } from "../src/model/index.js";

interface PromptLine {
  id?: string;
  prompt?: string;
  prompt_ids?: number[];
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      address: { type: "string" }, draft: { type: "string" }, prompts: { type: "string" },
      "max-new-tokens": { type: "string", default: "64" }, k: { type: "string", default: "auto" },
      warmup: { type: "string", default: "1" }, temperature: { type: "string", default: "0" },
      "api-key": { type: "string" }, speculate: { type: "string", default: "auto" },
    },
  });
  if (!values.address || !values.draft || !values.prompts) throw new Error("--address, --draft and --prompts are required");
  const draft = await loadDraft({ ort, source: values.draft, sessionOptions: { intraOpNumThreads: 1, interOpNumThreads: 1, executionMode: "sequential" } });
  const client = await EdgeClient.connect(values.address, { draft, apiKey: values["api-key"] });
  const prompts = readFileSync(values.prompts, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l) as PromptLine);
  const k: number | "auto" = values.k === "auto" ? "auto" : Number(values.k);
  const speculate: boolean | "auto" = values.speculate === "auto" ? "auto" : values.speculate === "true";
  const options: RequestOptions = { maxNewTokens: Number(values["max-new-tokens"]), k, temperature: Number(values.temperature), stopTokenIds: [] as number[], speculate };
  try {
    for (let i = 0; i < Number(values.warmup); i++) await client.generate(prompts[0]!.prompt_ids ?? prompts[0]!.prompt!, options);
    for (const line of prompts) {
      const result = await client.generate(line.prompt_ids ?? line.prompt!, options);
      const s = result.stats;
      process.stdout.write(JSON.stringify({
        id: line.id, token_ids: result.tokenIds, finish_reason: result.finishReason, wall_s: s.wallS, generated: s.generated,
        ms_per_token: s.msPerToken, rounds: s.rounds, mean_acceptance_length: s.meanAcceptanceLength,
        cloud_only_tokens: s.cloudOnlyTokens, segments: result.segments,
      }) + "\n");
    }
  } finally {
    client.close();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
