/**
 * The TypeScript client against the conformance kit (tests/conformance/scripted_verifier.py,
 * docs/conformance.md): runs each scenario the kit lists through `EdgeClient` and writes one
 * result line per scenario, which the kit's `check` judges.
 *
 *     python tests/conformance/scripted_verifier.py list --vocab-size V > scenarios.jsonl
 *     npx tsx conformance/run.ts --address 127.0.0.1:50070 --fingerprint F --vocab-size V \
 *         --scenarios scenarios.jsonl --results results.jsonl        (ws://127.0.0.1:PORT for WebSocket)
 *
 * The kit's target is a script, not a model, so the drafts need not be a model's: a scripted
 * drafter (the context's last token, repeated) stands in for the ONNX draft, with the draft's
 * fingerprint and vocabulary size (the kit checks the Open, never what is drafted).
 */

import { readFileSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { EdgeClient, ServerError, type Drafter, type Proposal } from "../src/index.js";

interface ScenarioRequest {
  scenario: string;
  rpc: "Session" | "Generate";
  prompt_ids: number[];
  max_new_tokens: number;
  stop_token_ids: number[];
  mode: "greedy";
  k: number;
  send_ahead: number;
}

/** Drafts the context's last token k times: valid ids, no model. */
export class ScriptedDrafter implements Drafter {
  tokens: number[] = [];
  readonly maxPositions = 1 << 20;
  readonly eosTokenIds: number[];

  constructor(readonly tokenizerFingerprint: string, readonly vocabSize: number) {
    this.eosTokenIds = [vocabSize - 1];
  }

  fork(): ScriptedDrafter {
    return new ScriptedDrafter(this.tokenizerFingerprint, this.vocabSize);
  }

  reset(contextIds: readonly number[]): void {
    this.tokens = [...contextIds];
  }

  append(tokenIds: readonly number[]): void {
    this.tokens.push(...tokenIds);
  }

  rollbackTo(n: number): void {
    this.tokens.length = n;
  }

  propose(k: number): Proposal {
    const drafts = new Array<number>(k).fill(this.tokens[this.tokens.length - 1] ?? 1);
    this.tokens.push(...drafts);
    return { tokens: drafts, q: null, draftMs: 0 };
  }
}

export async function runScenarios(address: string, drafter: Drafter, requests: ScenarioRequest[]): Promise<object[]> {
  const client = await EdgeClient.connect(address, { draft: drafter, timeoutS: 10, maxRetries: 2 });
  const results: object[] = [];
  try {
    for (const request of requests) {
      const options = { maxNewTokens: request.max_new_tokens, stopTokenIds: request.stop_token_ids, mode: request.mode };
      try {
        const result = request.rpc === "Generate"
          ? await client.generateCloud(request.prompt_ids, options)
          : await client.generate(request.prompt_ids, { ...options, k: request.k, speculate: true, sendAhead: request.send_ahead });
        results.push({ scenario: request.scenario, token_ids: result.tokenIds, finish_reason: result.finishReason });
      } catch (error) {
        const name = error instanceof ServerError ? error.codeName : (error as Error).constructor.name;
        results.push({ scenario: request.scenario, error: name, message: (error as Error).message });
      }
    }
  } finally {
    client.close();
  }
  return results;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      address: { type: "string" }, fingerprint: { type: "string" }, "vocab-size": { type: "string" },
      scenarios: { type: "string" }, results: { type: "string" },
    },
  });
  for (const name of ["address", "fingerprint", "vocab-size", "scenarios", "results"] as const) {
    if (!values[name]) throw new Error(`--${name} is required`);
  }
  const requests = readFileSync(values.scenarios!, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l) as ScenarioRequest);
  const drafter = new ScriptedDrafter(values.fingerprint!, Number(values["vocab-size"]));
  const results = await runScenarios(values.address!, drafter, requests);
  writeFileSync(values.results!, results.map((r) => JSON.stringify(r)).join("\n") + "\n");
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((error) => {
    console.error(error);
    process.exit(1);
  });
}
