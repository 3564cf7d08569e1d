"""The draft manifest: what the device needs to know about an exported ONNX draft.

``manifest.json`` sits beside ``model.onnx`` (written by ``edgespec export-draft``) and
describes the graph's contract, so the device never has to guess it from the ONNX file:

- *inputs*, in order: ``input_ids`` [1, n] int64, ``position_ids`` [1, n] int64, then for
  each layer ``past_key_values.{i}.key`` and ``past_key_values.{i}.value``
  [1, num_kv_heads, past, head_dim] ``kv_dtype``. ``n`` >= 1 and ``past`` >= 0 are dynamic;
  the first call passes a past of length 0.
- *outputs*, in order: ``logits`` [1, n, vocab_size] float32, then ``present.{i}.key`` and
  ``present.{i}.value`` [1, num_kv_heads, past + n, head_dim].
- *parity*: the largest |logit difference| between ONNX Runtime and the torch source model
  measured at export, so a device can tell how faithful its copy is.
- *graph* (format 2): the same contract spelled out for a runtime in any language: every input
  and output with its dtype and shape (symbolic dims ``n``, ``past``, ``past + n``), the KV layout,
  the position ids, the first call and the drafting loop (docs/manifest.schema.json is its JSON
  Schema). Format 1 manifests (no graph) are read and described the same way.
- *integrity* (format 3): ``onnx_sha256`` (and ``external_data``: each external-data file's
  sha256), checked by the device before it opens the graph; ``target``, the target the draft
  was made for (name, tokenizer fingerprint); ``parity`` relative to the logits' scale and in
  probabilities; ``quantization``; ``draft_vocab_size`` for a vocab-mapped draft (the graph
  maps target ids in and logits out itself, so its interface is the usual one). Formats 1 and
  2 load with these empty (no hash to check).

The tokenizer fingerprint (see ``edgespec.edge.tokenizer``) ties the draft to the
tokenizer it was trained with; the verifier refuses a session whose fingerprint differs.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)  # 1: before the graph section (it is derived on load); 2: before the graph's hash
KV_DTYPES = ("float32", "float16")
QUANTIZATIONS = ("", "int8")


def past_input_names(num_layers: int) -> list[str]:
    return [f"past_key_values.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


def present_output_names(num_layers: int) -> list[str]:
    return [f"present.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


@dataclass
class DraftManifest:
    """Describes an exported draft; validated on construction (errors name the field)."""

    architecture: str  # e.g. "LlamaForCausalLM"
    vocab_size: int  # size of the logits axis (may exceed the tokenizer's vocabulary)
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_positions: int  # longest context (prompt + drafts) the model was built for
    tokenizer_fingerprint: str
    opset: int
    input_names: list[str]
    output_names: list[str]
    onnx_file: str = "model.onnx"
    kv_dtype: str = "float32"
    eos_token_ids: list[int] = field(default_factory=list)
    source_model_dir: str = ""
    parity_max_abs_diff: float = 0.0  # max |logit diff| ORT vs torch over the export's parity run
    parity_steps: int = 0
    exporter: str = ""  # e.g. "torch.onnx dynamo, torch 2.13.0, transformers 5.24.0"
    format_version: int = FORMAT_VERSION
    graph: dict = field(default_factory=dict)  # format 2: the graph's contract, spelled out
    # Format 3: integrity and provenance. Empty in manifests read from formats 1 and 2.
    onnx_sha256: str = ""  # sha256 of onnx_file; the device refuses a graph that differs
    external_data: dict = field(default_factory=dict)  # external-data file name -> sha256 (graphs over 2 GB)
    target: dict = field(default_factory=dict)  # {"name", "tokenizer_fingerprint"} of the target it was made for
    parity: dict = field(default_factory=dict)  # {"max_rel_diff", "max_prob_diff"[, "int8": {...}]}
    quantization: str = ""  # "" (float weights) or "int8" (dynamic int8 weights)
    draft_vocab_size: int = 0  # a vocab-mapped draft's own vocabulary inside the graph; 0: the graph's vocab_size

    def __post_init__(self) -> None:
        if self.format_version not in READABLE_VERSIONS:
            raise ValueError(
                f"manifest format_version {self.format_version} is not supported (this edgespec "
                f"reads versions {READABLE_VERSIONS}); re-export the draft with this version"
            )
        for name in ("vocab_size", "num_layers", "num_kv_heads", "head_dim", "max_positions", "opset"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"manifest {name} must be a positive integer, got {value!r}")
        for name in ("architecture", "tokenizer_fingerprint", "onnx_file"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"manifest {name} must be a non-empty string")
        if Path(self.onnx_file).name != self.onnx_file:
            raise ValueError(f"manifest onnx_file must be a bare file name, got {self.onnx_file!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"manifest kv_dtype must be one of {KV_DTYPES}, got {self.kv_dtype!r}")
        self.input_names = list(self.input_names)
        self.output_names = list(self.output_names)
        expected_in = 2 + 2 * self.num_layers
        if len(self.input_names) != expected_in or len(set(self.input_names)) != expected_in:
            raise ValueError(
                f"manifest input_names must be {expected_in} distinct names (input_ids, position_ids, "
                f"then key and value per layer for {self.num_layers} layers), got {self.input_names}"
            )
        expected_out = 1 + 2 * self.num_layers
        if len(self.output_names) != expected_out or len(set(self.output_names)) != expected_out:
            raise ValueError(
                f"manifest output_names must be {expected_out} distinct names (logits, then key and "
                f"value per layer for {self.num_layers} layers), got {self.output_names}"
            )
        self.eos_token_ids = [int(t) for t in self.eos_token_ids]
        bad = [t for t in self.eos_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"manifest eos_token_ids {bad} are outside the vocabulary [0, {self.vocab_size})")
        if not self.parity_max_abs_diff >= 0.0:  # NOTE: also rejects NaN
            raise ValueError(f"manifest parity_max_abs_diff must be >= 0, got {self.parity_max_abs_diff!r}")
        if self.onnx_sha256 and (len(self.onnx_sha256) != 64 or any(c not in "0123456789abcdef" for c in self.onnx_sha256)):
            raise ValueError(f"manifest onnx_sha256 must be 64 lowercase hex digits, got {self.onnx_sha256!r}")
        for name in self.external_data:
            if Path(name).name != name:
                raise ValueError(f"manifest external_data names must be bare file names, got {name!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"manifest quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if not isinstance(self.draft_vocab_size, int) or not 0 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"manifest draft_vocab_size must be in [0, vocab_size], got {self.draft_vocab_size!r}")
        described = self.describe_graph()
        if self.graph and self.graph != described:
            raise ValueError("manifest graph does not match its names, dims and kv_dtype (edited by hand?); re-export the draft")
        self.graph, self.format_version = described, FORMAT_VERSION

    def describe_graph(self) -> dict:
        """The graph's inputs, outputs and calling convention, as written in format 2."""
        heads, dim, kv = self.num_kv_heads, self.head_dim, self.kv_dtype

        def cache(name: str, length: str, what: str) -> dict:
            return {"name": name, "dtype": kv, "shape": [1, heads, length, dim], "doc": what}

        inputs = [
            {"name": self.ids_input, "dtype": "int64", "shape": [1, "n"], "doc": "the n tokens fed: the context not yet cached"},
            {"name": self.positions_input, "dtype": "int64", "shape": [1, "n"],
             "doc": "absolute positions of those tokens: past, past + 1, ..., past + n - 1"},
        ] + [cache(name, "past", f"layer {i // 2}'s cached {'keys' if i % 2 == 0 else 'values'} of positions 0 .. past - 1")
             for i, name in enumerate(self.past_inputs)]
        outputs = [
            {"name": self.logits_output, "dtype": "float32", "shape": [1, "n", self.vocab_size],
             "doc": "next-token logits after each fed position (the last row predicts the next token)"},
        ] + [cache(name, "past + n", "the same cache with the n fed positions appended: the next call's past")
             for name in self.present_outputs]
        return {
            "inputs": inputs,
            "outputs": outputs,
            "dims": {"n": "tokens fed in this call, >= 1", "past": "positions already cached, >= 0"},
            "kv_layout": "per layer, key then value; [batch 1, kv heads, positions, head dim]",
            "first_call": f"past inputs of length 0: shape [1, {heads}, 0, {dim}]",
            "drafting": "feed the context not yet cached; the argmax (or a sample) of the last logits row is the next "
                        "draft; append it and feed it alone for the one after; the block's last draft is not fed. "
                        "Rolling back to m tokens keeps cache positions 0 .. m - 1.",
            "max_positions": self.max_positions,
        }

    # The fixed layout of the name lists (see the module docstring).
    @property
    def ids_input(self) -> str:
        return self.input_names[0]

    @property
    def positions_input(self) -> str:
        return self.input_names[1]

    @property
    def past_inputs(self) -> list[str]:
        return self.input_names[2:]

    @property
    def logits_output(self) -> str:
        return self.output_names[0]

    @property
    def present_outputs(self) -> list[str]:
        return self.output_names[1:]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    def save(self, model_dir: str | Path) -> Path:
        path = Path(model_dir) / MANIFEST_FILE
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    @classmethod
    def load(cls, model_dir: str | Path) -> DraftManifest:
        path = Path(model_dir) / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: a draft directory is made by `edgespec export-draft --model HF_DIR "
                f"--out {model_dir}` and holds model.onnx, tokenizer.json and {MANIFEST_FILE}"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path} has unknown fields {unknown}; was it written by a newer edgespec?")
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        missing = sorted(required - set(data))
        if missing:
            raise ValueError(f"{path} lacks required fields {missing}; re-export the draft")
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
