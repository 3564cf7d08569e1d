/**
 * manifest.json, the draft's contract (edge/manifest.py): the graph's input and output names,
 * the KV cache's shape, the tokenizer fingerprint and the graph's sha256. Read and checked here;
 * the fields keep their JSON (snake_case) names, as every language reads the same file.
 */

export const READABLE_VERSIONS = [1, 2, 3];

export interface DraftManifest {
  architecture: string;
  vocab_size: number;
  num_layers: number;
  num_kv_heads: number;
  head_dim: number;
  max_positions: number;
  tokenizer_fingerprint: string;
  opset: number;
  input_names: string[];
  output_names: string[];
  onnx_file: string;
  kv_dtype: "float32" | "float16";
  eos_token_ids: number[];
  format_version: number;
  /** sha256 of onnx_file (format 3); "" in older manifests: nothing to check. */
  onnx_sha256: string;
  /** External-data file name -> sha256. */
  external_data: Record<string, string>;
  quantization: "" | "int8";
  /** A vocab-mapped draft's own vocabulary inside the graph (its interface stays the target's). */
  draft_vocab_size: number;
  target: { name?: string; tokenizer_fingerprint?: string };
  [key: string]: unknown;
}

const POSITIVE = ["vocab_size", "num_layers", "num_kv_heads", "head_dim", "max_positions", "opset"] as const;

/** The manifest in `text`, checked (errors name the field and `where`). */
export function parseManifest(text: string, where = "manifest.json"): DraftManifest {
  let data: Record<string, unknown>;
  try {
    data = JSON.parse(text);
  } catch (error) {
    throw new Error(`${where} is not valid JSON: ${(error as Error).message}`);
  }
  const fail = (message: string): never => {
    throw new Error(`${where}: ${message}`);
  };
  if (!data || typeof data !== "object" || Array.isArray(data)) fail("must hold a JSON object");
  const manifest = {
    onnx_file: "model.onnx", kv_dtype: "float32", eos_token_ids: [], format_version: 3, onnx_sha256: "",
    external_data: {}, quantization: "", draft_vocab_size: 0, target: {}, ...data,
  } as unknown as DraftManifest;
  if (!READABLE_VERSIONS.includes(manifest.format_version)) {
    fail(`format_version ${manifest.format_version} is not supported (this client reads ${READABLE_VERSIONS.join(", ")}); re-export the draft`);
  }
  for (const name of POSITIVE) {
    if (!Number.isInteger(manifest[name]) || manifest[name] < 1) fail(`${name} must be a positive integer, got ${JSON.stringify(manifest[name])}`);
  }
  for (const name of ["architecture", "tokenizer_fingerprint", "onnx_file"] as const) {
    if (typeof manifest[name] !== "string" || !manifest[name]) fail(`${name} must be a non-empty string`);
  }
  if (/[\\/]/.test(manifest.onnx_file)) fail(`onnx_file must be a bare file name, got ${JSON.stringify(manifest.onnx_file)}`);
  if (!["float32", "float16"].includes(manifest.kv_dtype)) fail(`kv_dtype must be float32 or float16, got ${JSON.stringify(manifest.kv_dtype)}`);
  const layers = manifest.num_layers;
  if (!Array.isArray(manifest.input_names) || manifest.input_names.length !== 2 + 2 * layers) {
    fail(`input_names must be ${2 + 2 * layers} names (input_ids, position_ids, then key and value per layer)`);
  }
  if (!Array.isArray(manifest.output_names) || manifest.output_names.length !== 1 + 2 * layers) {
    fail(`output_names must be ${1 + 2 * layers} names (logits, then key and value per layer)`);
  }
  if (manifest.eos_token_ids.some((t) => !Number.isInteger(t) || t < 0 || t >= manifest.vocab_size)) {
    fail(`eos_token_ids ${JSON.stringify(manifest.eos_token_ids)} are outside the vocabulary [0, ${manifest.vocab_size})`);
  }
  if (manifest.onnx_sha256 && !/^[0-9a-f]{64}$/.test(manifest.onnx_sha256)) fail("onnx_sha256 must be 64 lowercase hex digits");
  if (Object.keys(manifest.external_data).length > 0) {
    fail("external data (graphs over 2 GB) is not supported by this client: a device draft fits one file");
  }
  return manifest;
}

export const pastInputs = (m: DraftManifest): string[] => m.input_names.slice(2);
export const presentOutputs = (m: DraftManifest): string[] => m.output_names.slice(1);
