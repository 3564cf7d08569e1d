// The tok1 tokenizer fingerprint in plain Node.js (no packages): a second implementation of
// docs/protocol.md "Tokenizer fingerprint", checked against the Python one by
// tests/edge/test_tokenizer.py.   Usage: node fingerprint.js path/to/tokenizer.json
"use strict";
const crypto = require("crypto");
const fs = require("fs");

function canonical(value) {  // RFC 8785
  if (value === null || typeof value === "boolean") return JSON.stringify(value);
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new Error("no NaN or infinity in JSON");
    return Object.is(value, -0) ? "0" : String(value);
  }
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
  const keys = Object.keys(value).sort();  // JS strings compare by UTF-16 code units
  return "{" + keys.map((k) => JSON.stringify(k) + ":" + canonical(value[k])).join(",") + "}";
}

function fingerprint(spec) {
  let model = spec.model === undefined ? null : spec.model;
  if (model && Array.isArray(model.merges)) {
    model = { ...model, merges: model.merges.map((m) => (typeof m === "string" ? splitFirst(m) : m)) };
  }
  const added = (spec.added_tokens || []).map((t) => ({ id: t.id, content: t.content, special: Boolean(t.special) }));
  const relevant = {
    model, added_tokens: added,
    normalizer: spec.normalizer === undefined ? null : spec.normalizer,
    pre_tokenizer: spec.pre_tokenizer === undefined ? null : spec.pre_tokenizer,
  };
  const digest = crypto.createHash("sha256").update(canonical(relevant), "utf8").digest("hex").slice(0, 16);
  const ids = new Set();
  const vocab = (spec.model || {}).vocab;
  if (Array.isArray(vocab)) vocab.forEach((_, i) => ids.add(i));
  else if (vocab) Object.values(vocab).forEach((id) => ids.add(id));
  added.forEach((t) => ids.add(t.id));
  const type = String((spec.model || {}).type || "unknown").toLowerCase();
  return `tok1-${type}-${ids.size}-${digest}`;
}

function splitFirst(merge) {
  const at = merge.indexOf(" ");
  return at < 0 ? [merge] : [merge.slice(0, at), merge.slice(at + 1)];
}

console.log(fingerprint(JSON.parse(fs.readFileSync(process.argv[2], "utf8"))));
