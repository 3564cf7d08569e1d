/** The committed codec (src/gen) is what `npm run proto` makes of proto/ today (as tests/test_proto.py for Python). */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { Speculative } from "../src/gen/edgespec/v1/speculative_pb.js";

const GENERATED = "src/gen/edgespec/v1/speculative_pb.ts";

describe("the generated codec", () => {
  it("is fresh: regenerating from proto/ gives the committed file", () => {
    const out = mkdtempSync(join(tmpdir(), "edgespec-proto-"));
    try {
      execFileSync("npx", ["buf", "generate", "--output", out], { stdio: "pipe" });
      assert.equal(readFileSync(join(out, GENERATED), "utf8"), readFileSync(GENERATED, "utf8"), "stale: run `npm run proto`");
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });

  it("has the three RPCs with their stream shapes", () => {
    const kinds = Object.fromEntries(Speculative.methods.map((m) => [m.name, m.methodKind]));
    assert.deepEqual(kinds, { Session: "bidi_streaming", Generate: "server_streaming", Info: "unary" });
  });
});
