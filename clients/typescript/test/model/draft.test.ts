import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, it } from "node:test";

import * as ort from "onnxruntime-node";

import { DraftIntegrityError } from "../../src/errors.js";
import * as model from "../../src/model/index.js";
import { loadDraft, memoryFiles } from "../../src/model/index.js";
import { DEMO_DRAFT, REAL_DRAFT, pythonReference } from "./reference.js";
import { replayScript } from "./script.js";

interface DraftReference {
  script: [string, unknown][];
  runs: { prompt_ids: number[]; results: unknown[]; tokens: number[] }[];
  eos_token_ids: number[];
}

for (const [name, dir] of [["demo", DEMO_DRAFT], ["smollm2-135m (int8, vocab-mapped)", REAL_DRAFT]] as const) {
  describe(`draft: ${name}`, async () => {
    const reference = await pythonReference<DraftReference>("draft", dir);
    const draft = await loadDraft({ ort, source: dir });

    it("drafts the Python draft's tokens: greedy, lookup, observe and coupled, with rollbacks between", async () => {
      const runs = await replayScript(draft, model, reference.script, reference.runs.map((run) => run.prompt_ids));
      runs.forEach((run, i) => {
        run.results.forEach((result, j) => assert.deepEqual(result, reference.runs[i].results[j], `run ${i} step ${j} (${reference.script[j][0]})`));
        assert.deepEqual(run.tokens, reference.runs[i].tokens);
      });
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
      const recorded = (JSON.parse(new TextDecoder().decode(files["manifest.json"])) as { onnx_sha256: string }).onnx_sha256.slice(0, 16);
      assert.match(error.message, new RegExp(`tampered/model\\.onnx has sha256 [0-9a-f]{16}\\.\\.\\., but manifest\\.json records ${recorded}`));
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
