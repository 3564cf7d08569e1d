"""Exporting a draft: a local Hugging Face causal LM -> an ONNX draft for the device (``edgespec export-draft``).

The exported directory holds ``model.onnx``, ``tokenizer.json`` and ``manifest.json``
(``edgespec.edge.manifest`` documents the graph's inputs and outputs). The graph takes the
KV cache as flat tensors, one key and one value per layer, so the device keeps its cache as
plain arrays and rolls it back by slicing.

*Empty past*: the first call (prefill) passes past tensors of shape [1, kv_heads, 0, head_dim];
the graph concatenates them with the new keys/values, so no separate prefill graph exists.

*Parity*: every export ends by greedy-decoding ``parity_steps`` cached steps from a short
prompt with the torch model (its own cache) and with ONNX Runtime fed the same tokens, plus one
pass over the same sequence in 3-token chunks (the shape the device uses after a rollback).
The export fails unless max |logit difference| <= tolerance and every greedy token matches.

The export is written to a temporary sibling directory and renamed into place, so a failed
export leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache, GenerationConfig

from edgespec.cloud.serving.config import DEFAULT_MAX_CONTEXT
from edgespec.edge.errors import EdgespecError
from edgespec.edge.graph import GraphRunner, open_session
from edgespec.edge.manifest import DraftManifest, past_input_names, present_output_names
from edgespec.edge.tokenizer import TOKENIZER_FILE, fingerprint, load_tokenizer

DEFAULT_OPSET = 18
EXPORTERS = ("dynamo", "legacy")
PARITY_PROMPT = "def main(argv):\n    parser = "
PARITY_CHUNK = 3
ONNX_FILE = "model.onnx"
# Above this many parameter bytes the weights go to an external-data file (protobuf caps a
# single file at 2 GiB).
_EXTERNAL_DATA_BYTES = 1 << 30


class ExportError(EdgespecError, RuntimeError):
    """The export could not be completed; the message says what to fix."""


class ParityError(ExportError):
    """ONNX Runtime disagrees with the torch model beyond the tolerance."""


@dataclass(frozen=True)
class ExportConfig:
    opset: int = DEFAULT_OPSET
    parity_steps: int = 20
    tolerance: float = 1e-4
    exporter: str = "dynamo"  # torch.onnx.export(dynamo=True) or the legacy TorchScript tracer
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not 14 <= self.opset <= 25:
            raise ValueError(f"opset must be in [14, 25], got {self.opset}")
        if self.parity_steps < 1:
            raise ValueError(f"parity_steps must be >= 1, got {self.parity_steps}")
        if not self.tolerance > 0:
            raise ValueError(f"tolerance must be > 0, got {self.tolerance}")
        if self.exporter not in EXPORTERS:
            raise ValueError(f"exporter must be one of {EXPORTERS}, got {self.exporter!r}")


@dataclass(frozen=True)
class ParityResult:
    max_abs_diff: float  # over every compared logit, cached steps and chunked pass
    greedy_match: bool  # ORT argmax == torch argmax at every cached step
    steps: int
    first_mismatch: int | None  # index of the first cached step whose argmax differs


@dataclass(frozen=True)
class ExportReport:
    out_dir: Path
    onnx_path: Path
    manifest: DraftManifest
    parity: ParityResult
    seconds: float


class FlatKVWrapper(torch.nn.Module):
    """A causal LM whose KV cache goes in and out as flat tensors (key, value per layer).

    forward(input_ids [1, n] int64, position_ids [1, n] int64, *past [1, kv_heads, past, head_dim])
      -> (logits [1, n, V], *present [1, kv_heads, past + n, head_dim])
    """

    def __init__(self, model: torch.nn.Module, num_layers: int):
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor):
        cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)])
        # One unpadded sequence: the mask is all ones; passing it explicitly keeps the model off
        # its "no mask" shortcuts, whose choice depends on shapes seen at export time.
        mask = torch.ones((1, past[0].shape[2] + input_ids.shape[1]), dtype=torch.int64)
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, cache=cache, use_cache=True)
        present = []
        for layer in out.cache.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


@dataclass(frozen=True)
class _KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int


def is_mixture_of_experts(model_dir: Path) -> bool:
    import json

    data = json.loads((model_dir / "config.json").read_text())
    text = data.get("text_config") or data
    return any(text.get(name) for name in ("num_experts", "num_local_experts", "n_routed_experts"))


def load_source_model(model_dir: Path) -> torch.nn.Module:
    if not (model_dir / "config.json").is_file():
        raise ExportError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    transformers.utils.logging.disable_progress_bar()
    try:
        # float32: the draft runs on CPU, where ONNX Runtime's fp16 kernels are slow or missing.
        extra = {}
        if is_mixture_of_experts(model_dir):
            # The default experts kernel (grouped_mm) has no ONNX translation; the batched one
            # exports, and the parity check runs the same kernel.
            extra["experts_implementation"] = "batched_mm"
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, local_files_only=True, **extra)
    except (ValueError, OSError, KeyError) as exc:
        raise ExportError(f"cannot load {model_dir} as a causal LM: {exc}") from exc
    return model.eval()


def probe_kv_layout(model: torch.nn.Module) -> _KVLayout:
    """Reads the cache layout from a real forward rather than trusting config field names."""
    with torch.no_grad():
        out = model(input_ids=torch.zeros((1, 2), dtype=torch.int64), cache=DynamicCache(), use_cache=True)
    shapes = {(tuple(layer.keys.shape), tuple(layer.values.shape)) for layer in out.cache.layers}
    if len(shapes) != 1:
        raise ExportError(f"layers have different KV shapes {sorted(shapes)}; only uniform caches are supported")
    (key_shape, value_shape), = shapes
    if key_shape != value_shape or len(key_shape) != 4:
        raise ExportError(f"unsupported KV layout: keys {key_shape}, values {value_shape}")
    return _KVLayout(len(out.cache.layers), key_shape[1], key_shape[3], out.logits.shape[-1])


def max_positions_of(config, override: int | None = None) -> tuple[int, str]:
    """The draft's longest context and where it comes from: ``override``, else the config's
    own limit, else (ALiBi models name none) the verifier's default for such models."""
    if override is not None:
        if override < 1:
            raise ExportError(f"--max-positions must be >= 1, got {override}")
        return override, "--max-positions"
    text = config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value, name
    return DEFAULT_MAX_CONTEXT, "the config names none: the verifier's default (pass --max-positions)"


def eos_token_ids_of(model_dir: Path, config) -> list[int]:
    ids: list[int] = []
    sources = [config.get_text_config().eos_token_id]
    if (model_dir / "generation_config.json").is_file():
        sources.insert(0, GenerationConfig.from_pretrained(str(model_dir)).eos_token_id)
    for value in sources:
        for token in [value] if isinstance(value, int) else (value or []):
            if token not in ids:
                ids.append(int(token))
    return ids


# Families whose tiny random drafts export and pass parity here (tests/cloud/training/test_export_families.py).
EXPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "starcoder2", "gpt2",
                     "gpt_neox", "opt", "falcon", "codegen", "bloom", "mixtral", "qwen2_moe")


@contextlib.contextmanager
def _quiet_exporter():
    # NOTE: exporter warnings and log lines (tracer constant-folding notes, deprecations,
    # "torchvision is not installed") are noise here: the parity check decides whether the
    # graph is right.
    onnx_logger = logging.getLogger("torch.onnx")
    level = onnx_logger.level
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            onnx_logger.setLevel(level)


def export_onnx(model: torch.nn.Module, layout: _KVLayout, path: Path, config: ExportConfig) -> None:
    """Writes the flat-KV graph with dynamic new-token count ``n`` and past length ``past``."""
    wrapper = FlatKVWrapper(model, layout.num_layers).eval()
    # A sample with past=3, n=2: neither is 0 or 1, which the tracer would specialise on.
    ids = torch.zeros((1, 2), dtype=torch.int64)
    positions = torch.tensor([[3, 4]], dtype=torch.int64)
    past = tuple(torch.zeros((1, layout.num_kv_heads, 3, layout.head_dim)) for _ in range(2 * layout.num_layers))
    input_names = ["input_ids", "position_ids", *past_input_names(layout.num_layers)]
    output_names = ["logits", *present_output_names(layout.num_layers)]
    large = sum(p.numel() * p.element_size() for p in model.parameters()) > _EXTERNAL_DATA_BYTES
    try:
        with _quiet_exporter(), torch.no_grad():
            if config.exporter == "dynamo":
                n = torch.export.Dim("n", min=1)
                past_len = torch.export.Dim("past", min=0)
                dynamic = {"input_ids": {1: n}, "position_ids": {1: n}, "past": tuple({2: past_len} for _ in past)}
                torch.onnx.export(
                    wrapper, (ids, positions, *past), str(path), dynamo=True, dynamic_shapes=dynamic,
                    input_names=input_names, output_names=output_names, opset_version=config.opset,
                    external_data=large, verbose=False,
                )
            else:
                axes = {"input_ids": {1: "n"}, "position_ids": {1: "n"}, "logits": {1: "n"}}
                axes.update({name: {2: "past"} for name in input_names[2:]})
                axes.update({name: {2: "past_plus_n"} for name in output_names[1:]})
                torch.onnx.export(
                    wrapper, (ids, positions, *past), str(path), dynamo=False, dynamic_axes=axes,
                    input_names=input_names, output_names=output_names, opset_version=config.opset,
                )
    except Exception as exc:  # torch.export / ONNX translation errors are many types
        other = "legacy" if config.exporter == "dynamo" else "dynamo"
        family = getattr(model.config, "model_type", type(model).__name__)
        lines = str(exc).strip().splitlines() or [""]
        first = lines[0][:300] + (" ..." if len(lines) > 1 or len(lines[0]) > 300 else "")  # a graph dump can run to hundreds of lines
        raise ExportError(
            f"{family} ({type(model).__name__}) does not export with torch.onnx {config.exporter}: {type(exc).__name__}: "
            f"{first}. Try --exporter {other}, or a draft of a family that exports: {', '.join(EXPORTED_FAMILIES)}"
        ) from exc
    model.eval()  # the exporters toggle training mode; keep dropout off for the parity run


def check_parity(model: torch.nn.Module, onnx_path: Path, manifest: DraftManifest, prompt: list[int], steps: int) -> ParityResult:
    """Greedy-decodes ``steps`` cached steps with torch, replays them in ONNX Runtime, compares."""
    # 1. Torch reference: prefill, then one token per step with the model's own cache.
    torch_logits, tokens, cache = [], list(prompt), DynamicCache()
    chunk = list(prompt)
    with torch.no_grad():
        for _ in range(steps + 1):
            out = model(input_ids=torch.tensor([chunk]), cache=cache, use_cache=True)
            cache = out.cache
            torch_logits.append(out.logits[0].float().numpy())
            chunk = [int(torch_logits[-1][-1].argmax())]
            tokens.append(chunk[0])
    session = open_session(onnx_path, threads=1)
    # 2. The same chunks through ONNX Runtime, starting from an empty past.
    runner, max_diff, first_mismatch = GraphRunner(session, manifest), 0.0, None
    fed = 0
    for step, expected in enumerate(torch_logits):
        got = runner.feed(tokens[fed : fed + len(expected)])
        fed += len(expected)
        max_diff = max(max_diff, float(np.abs(got - expected).max()))
        if first_mismatch is None and int(got[-1].argmax()) != int(expected[-1].argmax()):
            first_mismatch = step
    # 3. The fed sequence again in small chunks: several new tokens against a non-empty past.
    reference = np.concatenate(torch_logits)
    runner = GraphRunner(session, manifest)
    for start in range(0, len(reference), PARITY_CHUNK):
        got = runner.feed(tokens[start : start + PARITY_CHUNK][: len(reference) - start])
        max_diff = max(max_diff, float(np.abs(got - reference[start : start + len(got)]).max()))
    return ParityResult(max_diff, first_mismatch is None, steps, first_mismatch)


def _parity_prompt(tokenizer, vocab_size: int) -> list[int]:
    ids = [i for i in tokenizer.encode(PARITY_PROMPT).ids if i < vocab_size]
    return ids if len(ids) >= 2 else [1 % vocab_size, 2 % vocab_size, 3 % vocab_size]


def export_draft(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    parity_steps: int = 20,
    tolerance: float = 1e-4,
    exporter: str = "dynamo",
    overwrite: bool = False,
    max_positions: int | None = None,
    log: Callable[[str], None] = print,
) -> ExportReport:
    """Exports ``model_dir`` to ``out_dir`` (model.onnx, tokenizer.json, manifest.json).

    Raises ``ExportError`` (``ParityError`` when the parity check fails); ``out_dir`` is then untouched.
    """
    config = ExportConfig(opset, parity_steps, tolerance, exporter, overwrite)
    model_dir, out_dir = Path(model_dir).resolve(), Path(out_dir).resolve()
    if out_dir.exists() and not overwrite:
        raise ExportError(f"{out_dir} already exists; pass overwrite=True (--overwrite) or choose another --out")
    started = time.perf_counter()
    log(f"[1/5] loading {model_dir}")
    tokenizer = load_tokenizer(model_dir)
    model = load_source_model(model_dir)
    layout = probe_kv_layout(model)
    max_positions, source = max_positions_of(model.config, max_positions)  # before the export, which takes minutes
    if source != "max_position_embeddings":
        log(f"      longest context {max_positions} ({source})")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result should be an ordinary directory
    try:
        log(
            f"[2/5] exporting {type(model).__name__} ({layout.num_layers} layers, {layout.num_kv_heads} kv heads x "
            f"{layout.head_dim}, vocab {layout.vocab_size}) with torch.onnx {config.exporter}, opset {config.opset}"
        )
        export_onnx(model, layout, staging / ONNX_FILE, config)
        shutil.copyfile(model_dir / TOKENIZER_FILE, staging / TOKENIZER_FILE)
        manifest = DraftManifest(
            architecture=type(model).__name__,
            vocab_size=layout.vocab_size,
            num_layers=layout.num_layers,
            num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim,
            max_positions=max_positions,
            tokenizer_fingerprint=fingerprint(model_dir),
            opset=config.opset,
            input_names=["input_ids", "position_ids", *past_input_names(layout.num_layers)],
            output_names=["logits", *present_output_names(layout.num_layers)],
            onnx_file=ONNX_FILE,
            eos_token_ids=eos_token_ids_of(model_dir, model.config),
            source_model_dir=str(model_dir),
            parity_steps=config.parity_steps,
            exporter=f"torch.onnx {config.exporter}, torch {torch.__version__}, transformers {transformers.__version__}",
        )
        log(f"[3/5] parity check: {config.parity_steps} cached greedy steps, torch vs ONNX Runtime")
        parity = check_parity(model, staging / ONNX_FILE, manifest, _parity_prompt(tokenizer, layout.vocab_size), config.parity_steps)
        verdict = "ok" if parity.max_abs_diff <= config.tolerance and parity.greedy_match else "FAILED"
        log(
            f"      max |logit diff| = {parity.max_abs_diff:.3g} (tolerance {config.tolerance:g}), "
            f"greedy tokens match: {parity.greedy_match} -> {verdict}"
        )
        if verdict != "ok":
            where = f"; first greedy mismatch at step {parity.first_mismatch}" if not parity.greedy_match else ""
            raise ParityError(
                f"ONNX Runtime disagrees with torch: max |logit diff| {parity.max_abs_diff:.3g} vs tolerance "
                f"{config.tolerance:g}{where}. Try the other exporter (--exporter), another --opset, or a "
                f"looser --tolerance if the model's logits are very large"
            )
        manifest.parity_max_abs_diff = parity.max_abs_diff
        log("[4/5] writing manifest.json")
        manifest.save(staging)
        log(f"[5/5] moving into {out_dir}")
        _move_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportReport(out_dir, out_dir / ONNX_FILE, manifest, parity, time.perf_counter() - started)


def _move_into_place(staging: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        staging.rename(out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}.old-{staging.name.rsplit('.', 2)[-2]}")
    out_dir.rename(old)
    staging.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)
