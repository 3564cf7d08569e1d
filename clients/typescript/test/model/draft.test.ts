import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, it } from "node:test";

import * as ort from "onnxruntime-node";

import { DraftIntegrityError } from "../../src/errors.js";
import { type DraftModel, PositionDraws, loadDraft, lookupConfig, memoryFiles } from "../../src/model/index.js";
import { DEMO_DRAFT, REAL_DRAFT, pythonReference } from "./reference.js";

interface DraftReference {
  script: [string, unknown][];
  runs: { prompt_ids: number[]; results: unknown[]; tokens: number[] }[];
  eos_token_ids: number[];
}

const SAMPLING = { temperature: 0.8, topK: 0, topP: 1, seed: 7n };

/** One step of python_reference.py's DRAFT_SCRIPT, as edge/draft.py's DraftModel ran it. */
async function step(draft: DraftModel, promptLength: number, op: string, arg: unknown): Promise<unknown> {
  switch (op) {
    case "propose": return (await draft.propose(arg as number)).tokens;
    case "propose_lookup": return (await draft.propose(arg as number, { lookup: lookupConfig() })).tokens;
    case "propose_coupled": return (await draft.propose(arg as number, { sampling: SAMPLING, rng: new PositionDraws(7) })).tokens;
    case "propose_coupled_top8":
      return (await draft.propose(arg as number, { sampling: SAMPLING, rng: new PositionDraws(7), topN: 8 })).tokens;
    case "rollback_keep": draft.rollbackTo(promptLength + (arg as number)); return draft.tokens.length;
    case "append": draft.append([arg as number]); return draft.tokens.length;
    case "observe": return draft.observe(arg as number[]);
    default: throw new Error(op);
  }
}

for (const [name, dir] of [["demo", DEMO_DRAFT], ["smollm2-135m (int8, vocab-mapped)", REAL_DRAFT]] as const) {
  describe(`draft: ${name}`, async () => {
    const reference = await pythonReference<DraftReference>("draft", dir);
    const draft = await loadDraft({ ort, source: dir });

    it("drafts the Python draft's tokens: greedy, lookup, observe and coupled, with rollbacks between", async () => {
      for (const run of reference.runs) {
        draft.reset(run.prompt_ids);
        for (const [i, [op, arg]] of reference.script.entries()) {
          assert.deepEqual(await step(draft, run.prompt_ids.length, op, arg), run.results[i], `step ${i} (${op})`);
        }
        assert.deepEqual(draft.tokens, run.tokens);
      }
    });

    it("has the Python draft's end tokens", () => {
      assert.deepEqual(draft.eosTokenIds, reference.eos_token_ids);
    });

    it("a fork shares the session and keeps its own context", async () => {
      const fork = draft.fork();
      const prompt = reference.runs[0].prompt_ids;
      fork.reset(prompt);
      const greedy = (await fork.propose(4)).tokens;
      assert.deepEqual(greedy, reference.runs[0].results[0]);
      assert.notDeepEqual(fork.tokens, draft.tokens);
    });
  });
}

describe("draft: the manifest's hash check", () => {
  it("refuses a tampered graph with DraftIntegrityError, and opens the untouched one", async () => {
    const files: Record<string, Uint8Array> = {};
    for (const file of ["manifest.json", "tokenizer.json", "model.onnx"]) files[file] = new Uint8Array(await readFile(join(DEMO_DRAFT, file)));
    await loadDraft({ ort, source: memoryFiles({ ...files }) });
    const tampered = files["model.onnx"].slice();
    tampered[tampered.length - 1] ^= 1;
    await assert.rejects(loadDraft({ ort, source: memoryFiles({ ...files, "model.onnx": tampered }, "tampered") }), (error: Error) => {
      assert.ok(error instanceof DraftIntegrityError);
      assert.match(error.message, /tampered\/model\.onnx has sha256 [0-9a-f]{16}\.\.\., but manifest\.json records 31089a9330af73f3/);
      return true;
    });
  });

  it("refuses a tokenizer whose fingerprint is not the manifest's", async () => {
    const spec = JSON.parse(await readFile(join(DEMO_DRAFT, "tokenizer.json"), "utf8"));
    spec.model.merges.pop();
    const files = {
      "manifest.json": await readFile(join(DEMO_DRAFT, "manifest.json"), "utf8"),
      "tokenizer.json": JSON.stringify(spec),
      "model.onnx": new Uint8Array(await readFile(join(DEMO_DRAFT, "model.onnx"))),
    };
    await assert.rejects(loadDraft({ ort, source: memoryFiles(files) }), /has fingerprint tok1-bpe-4096-[0-9a-f]{16}, but the draft was exported with tok1-bpe-4096-4b9b3d3517fbfa0a/);
  });
});
