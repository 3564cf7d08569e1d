import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, it } from "node:test";

import { type ChatMessage, chatTemplateOf, renderChat } from "../../src/model/chat.js";
import { nodeFiles } from "../../src/model/files.js";
import { Tokenizer, canonicalJson, fingerprint } from "../../src/model/tokenizer.js";
import { DEMO_DRAFT, REAL_DRAFT, REPO, pythonReference } from "./reference.js";

interface TokenizerReference {
  fingerprint: string;
  vocab_size: number;
  texts: string[];
  ids: number[][];
  decoded: string[];
  decoded_special: string[];
  chat: { messages: unknown[]; text: string; ids: number[] }[];
}

for (const [name, dir] of [["demo", DEMO_DRAFT], ["smollm2-135m", REAL_DRAFT]] as const) {
  describe(`tokenizer: ${name} draft`, async () => {
    const reference = await pythonReference<TokenizerReference>("tokenizer", dir);
    const tokenizer = Tokenizer.fromJSON(await readFile(join(dir, "tokenizer.json"), "utf8"));

    it("has the Python fingerprint (tok1) and vocabulary size", async () => {
      assert.equal(await tokenizer.fingerprint(), reference.fingerprint);
      assert.equal(tokenizer.vocabSize, reference.vocab_size);
      const manifest = JSON.parse(await readFile(join(dir, "manifest.json"), "utf8"));
      assert.equal(await tokenizer.fingerprint(), manifest.tokenizer_fingerprint);
    });

    it("encodes every held-out prompt (and the awkward extras) to Python's ids", () => {
      assert.ok(reference.texts.length >= 112 + 8);
      reference.texts.forEach((text, i) => assert.deepEqual(tokenizer.encode(text), reference.ids[i], `text ${i}: ${JSON.stringify(text.slice(0, 60))}`));
    });

    it("decodes them back as Python does, with and without special tokens", () => {
      reference.ids.forEach((ids, i) => {
        assert.equal(tokenizer.decode(ids), reference.decoded[i], `text ${i}`);
        assert.equal(tokenizer.decode(ids, { skipSpecialTokens: false }), reference.decoded_special[i], `text ${i}`);
      });
    });

    it("renders chat messages through the draft's chat template to transformers' apply_chat_template ids", async () => {
      const template = await chatTemplateOf(nodeFiles(dir));
      assert.equal(template === null, reference.chat.length === 0);
      if (template === null) return; // (the demo draft has no chat template: nothing to render)
      assert.ok(reference.chat.length >= 49);
      for (const { messages, text, ids } of reference.chat) {
        assert.equal(renderChat(template, messages as ChatMessage[]), text);
        assert.deepEqual(tokenizer.encode(renderChat(template, messages as ChatMessage[])), ids);
      }
      const parts = renderChat(template, [{ role: "user", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] }]);
      assert.match(parts, /<\|im_start\|>user\na\nb<\|im_end\|>\n<\|im_start\|>assistant\n$/);
    });

    it("decodes a token cut in the middle of a character to U+FFFD, as Rust's from_utf8_lossy", () => {
      const ids = tokenizer.encode("😀");
      const text = tokenizer.decode(ids.slice(0, -1));
      assert.ok(ids.length === 1 || text.endsWith("\ufffd"));
    });
  });
}

describe("tok1 fingerprint: docs/protocol.md's test vectors", () => {
  it("gives the documented fingerprints and canonical form", async () => {
    for (const [file, expected] of [["bpe.tokenizer.json", "tok1-bpe-5-96a8675186da1485"], ["unigram.tokenizer.json", "tok1-unigram-4-92c4ad0a44bbed53"]]) {
      const spec = JSON.parse(await readFile(join(REPO, "docs/fingerprint", file), "utf8"));
      assert.equal(await fingerprint(spec), expected);
    }
    assert.equal(canonicalJson({ b: [1, -2.25e-7, 1e21, 0.5], a: "é\n", "€": null, "\u00e9": true }), '{"a":"é\\n","b":[1,-2.25e-7,1e+21,0.5],"é":true,"€":null}');
  });

  it("changes when a merge changes", async () => {
    const spec = JSON.parse(await readFile(join(DEMO_DRAFT, "tokenizer.json"), "utf8"));
    const before = await fingerprint(spec);
    spec.model.merges[5] = ["x", "y"];
    assert.notEqual(await fingerprint(spec), before);
  });
});
