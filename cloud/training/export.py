"""Exporting a draft: a local Hugging Face causal LM -> an ONNX draft for the device (``edgespec export-draft``).

The exported directory holds ``model.onnx``, ``manifest.json`` (``edgespec.edge.manifest``
documents the graph's inputs and outputs; it records the graph's sha256, which the device
checks, and the target the draft was made for), ``tokenizer.json`` and the tokenizer's side
files that the source has (``tokenizer_config.json``, ``special_tokens_map.json``,
``chat_template.jinja``, ``generation_config.json``). Weights above 1 GiB go to an external-data
file (protobuf caps one file at 2 GiB), hashed in the manifest too. The graph takes the
KV cache as flat tensors, one key and one value per layer, so the device keeps its cache as
plain arrays and rolls it back by slicing.

*Empty past*: the first call (prefill) passes past tensors of shape [1, kv_heads, 0, head_dim];
the graph concatenates them with the new keys/values, so no separate prefill graph exists.

*Parity*: every export ends by greedy-decoding ``parity_steps`` cached steps from a short
prompt with the torch model (its own cache) and with ONNX Runtime fed the same tokens, plus one
pass over the same sequence in 3-token chunks (the shape the device uses after a rollback).
The export fails unless every greedy token matches, max |logit difference| / max(1, max |logit|)
<= ``tolerance`` (relative to the logits' scale: a Gemma-3-sized model's logits run to the
tens, where float error reaches 1e-4 in absolute terms with no effect on anything) and
max |softmax difference| <= ``prob_tolerance`` (what sampling and the accept rule see).

*Vocab-mapped drafts* (``draft_vocab.json``, ``edgespec.cloud.training.draft_vocab``): the
graph gathers target ids to draft ids on the way in and scatters the draft's logits into the
target's vocabulary on the way out (-1e9 elsewhere), so the device sees the usual interface.

*int8* (``quantize="int8"``): after the float graph passed parity, ONNX Runtime's dynamic
quantisation stores the weights as int8; the manifest records how often its greedy token
agrees with the float graph's. Speculation stays lossless: the target decides every token.

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
from transformers import AutoModelForCausalLM, DynamicCache

from edgespec.cloud.serving.config import DEFAULT_MAX_CONTEXT
from edgespec.edge.eos import CHAT_TEMPLATE_FILE, eos_token_ids
from edgespec.edge.errors import EdgespecError
from edgespec.cloud.training.draft_vocab import DRAFT_VOCAB_FILE, MASKED_LOGIT, VocabMappedLM, load_draft_vocab
from edgespec.edge.graph import GraphRunner, open_session, sha256_file
from edgespec.edge.manifest import DraftManifest, past_input_names, present_output_names
from edgespec.edge.tokenizer import TOKENIZER_FILE, fingerprint, load_tokenizer

DEFAULT_OPSET = 18
EXPORTERS = ("dynamo", "legacy")
QUANTIZATIONS = (None, "int8")
INT8_OP_TYPES = ("MatMul", "Gemm")  # what --quantize int8 quantises (embeddings stay float)
PARITY_PROMPT = "def main(argv):\n    parser = "
PARITY_CHUNK = 3
ONNX_FILE = "model.onnx"
FLOAT_ONNX_FILE = "model.fp32.onnx"  # --quantize int8 --keep-fp32: the float graph beside the int8 one
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
    tolerance: float = 1e-4  # max |logit diff| / max(1, max |logit|)
    exporter: str = "dynamo"  # torch.onnx.export(dynamo=True) or the legacy TorchScript tracer
    overwrite: bool = False
    prob_tolerance: float = 1e-3  # max |softmax diff|
    quantize: str | None = None  # "int8": dynamic int8 weights (onnxruntime.quantization)
    keep_fp32: bool = False  # with quantize: keep the float graph as model.fp32.onnx

    def __post_init__(self) -> None:
        if not 14 <= self.opset <= 25:
            raise ValueError(f"opset must be in [14, 25], got {self.opset}")
        if self.parity_steps < 1:
            raise ValueError(f"parity_steps must be >= 1, got {self.parity_steps}")
        if not self.tolerance > 0:
            raise ValueError(f"tolerance must be > 0, got {self.tolerance}")
        if not self.prob_tolerance > 0:
            raise ValueError(f"prob_tolerance must be > 0, got {self.prob_tolerance}")
        if self.quantize not in QUANTIZATIONS:
            raise ValueError(f"quantize must be one of {QUANTIZATIONS}, got {self.quantize!r}")
        if self.exporter not in EXPORTERS:
            raise ValueError(f"exporter must be one of {EXPORTERS}, got {self.exporter!r}")


@dataclass(frozen=True)
class ParityResult:
    max_abs_diff: float  # over every compared logit, cached steps and chunked pass
    greedy_match: bool  # ORT argmax == torch argmax at every cached step
    steps: int
    first_mismatch: int | None  # index of the first cached step whose argmax differs
    max_rel_diff: float = 0.0  # max_abs_diff / max(1, max |torch logit|): the error against the logits' scale
    max_prob_diff: float = 0.0  # max |softmax difference|: what sampling and the accept rule see

    def passes(self, tolerance: float, prob_tolerance: float) -> bool:
        return self.greedy_match and self.max_rel_diff <= tolerance and self.max_prob_diff <= prob_tolerance


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
    """Every end token of the model (``edgespec.edge.eos``'s rule), the config's own if none is named."""
    vocab_size = config.get_text_config().vocab_size
    ids = eos_token_ids(model_dir, vocab_size)
    value = config.get_text_config().eos_token_id
    for token in [value] if isinstance(value, int) else (value or []):
        if int(token) not in ids and 0 <= int(token) < vocab_size:
            ids.append(int(token))
    return ids


# Files beside tokenizer.json that the device reads when present: the chat template (either
# form), the tokenizer's config (special tokens, template) and the generation config (end tokens).
TOKENIZER_SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json", CHAT_TEMPLATE_FILE, "generation_config.json")


def copy_tokenizer_files(model_dir: Path, out_dir: Path) -> list[str]:
    copied = []
    for name in (TOKENIZER_FILE, *TOKENIZER_SIDE_FILES):
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, out_dir / name)
            copied.append(name)
    return copied


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


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits.astype(np.float64) - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class _Diff:
    """The running comparison: absolute and relative logit error and softmax error, over the
    entries the draft has (a vocab-mapped draft's masked entries must stay masked in both)."""

    def __init__(self):
        self.max_abs, self.scale, self.max_prob, self.mask_broken = 0.0, 0.0, 0.0, False

    def add(self, got: np.ndarray, expected: np.ndarray) -> None:
        real = expected > MASKED_LOGIT / 2
        if np.any((got > MASKED_LOGIT / 2) != real):
            self.mask_broken = True
        self.max_abs = max(self.max_abs, float(np.abs(got - expected)[real].max()))
        self.scale = max(self.scale, float(np.abs(expected[real]).max()))
        self.max_prob = max(self.max_prob, float(np.abs(_softmax(got) - _softmax(expected)).max()))

    @property
    def max_rel(self) -> float:
        # NOTE: the scale has a floor of 1, so a model with small logits is held to the absolute
        # tolerance (as before) rather than to a tighter one.
        return float("inf") if self.mask_broken else self.max_abs / max(self.scale, 1.0)


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
    runner, diff, first_mismatch = GraphRunner(session, manifest), _Diff(), None
    fed = 0
    for step, expected in enumerate(torch_logits):
        got = runner.feed(tokens[fed : fed + len(expected)])
        fed += len(expected)
        diff.add(got, expected)
        if first_mismatch is None and int(got[-1].argmax()) != int(expected[-1].argmax()):
            first_mismatch = step
    # 3. The fed sequence again in small chunks: several new tokens against a non-empty past.
    reference = np.concatenate(torch_logits)
    runner = GraphRunner(session, manifest)
    for start in range(0, len(reference), PARITY_CHUNK):
        got = runner.feed(tokens[start : start + PARITY_CHUNK][: len(reference) - start])
        diff.add(got, reference[start : start + len(got)])
    return ParityResult(diff.max_abs, first_mismatch is None, steps, first_mismatch, diff.max_rel, diff.max_prob)


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
    prob_tolerance: float = 1e-3,
    exporter: str = "dynamo",
    overwrite: bool = False,
    max_positions: int | None = None,
    quantize: str | None = None,
    keep_fp32: bool = False,
    target_dir: str | Path | None = None,
    log: Callable[[str], None] = print,
) -> ExportReport:
    """Exports ``model_dir`` to ``out_dir`` (model.onnx, the tokenizer files, manifest.json).

    ``target_dir``: the target the draft is made for; its name and tokenizer fingerprint go into
    the manifest, and the fingerprints must agree (a vocab-mapped draft, ``draft_vocab.json``,
    takes its tokenizer files from the target when they are not in ``model_dir``).
    ``quantize="int8"``: the shipped graph has dynamic int8 weights (after the float graph passed
    parity); ``keep_fp32`` keeps the float graph beside it as ``model.fp32.onnx``.
    Raises ``ExportError`` (``ParityError`` when the parity check fails); ``out_dir`` is then untouched.
    """
    config = ExportConfig(opset, parity_steps, tolerance, exporter, overwrite, prob_tolerance, quantize, keep_fp32)
    model_dir, out_dir = Path(model_dir).resolve(), Path(out_dir).resolve()
    target_dir = Path(target_dir).resolve() if target_dir is not None else None
    if out_dir.exists() and not overwrite:
        raise ExportError(f"{out_dir} already exists; pass overwrite=True (--overwrite) or choose another --out")
    started = time.perf_counter()
    log(f"[1/5] loading {model_dir}")
    try:
        vocab = load_draft_vocab(model_dir)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    tokenizer_dir = model_dir
    if vocab is not None and not (model_dir / TOKENIZER_FILE).is_file():
        if target_dir is None:
            raise ExportError(f"{model_dir} is vocab-mapped ({DRAFT_VOCAB_FILE}) and has no {TOKENIZER_FILE}: pass --target, whose tokenizer the graph speaks")
        tokenizer_dir = target_dir
    tokenizer = load_tokenizer(tokenizer_dir)
    model = load_source_model(model_dir)
    if vocab is not None:
        if vocab.draft_vocab_size != model.config.get_text_config().vocab_size:
            raise ExportError(f"{DRAFT_VOCAB_FILE} maps {vocab.draft_vocab_size} draft ids but the model's vocab_size is "
                              f"{model.config.get_text_config().vocab_size}")
        log(f"      vocab-mapped draft: {vocab.draft_vocab_size} draft ids inside a graph over the target's {vocab.target_vocab_size}")
        model = VocabMappedLM(model, vocab).eval()
    layout = probe_kv_layout(model)
    target = _target_record(target_dir, tokenizer_dir)
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
        copy_tokenizer_files(tokenizer_dir, staging)
        architecture = type(model.model if vocab is not None else model).__name__
        manifest = DraftManifest(
            architecture=architecture,
            vocab_size=layout.vocab_size,
            num_layers=layout.num_layers,
            num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim,
            max_positions=max_positions,
            tokenizer_fingerprint=fingerprint(tokenizer_dir),
            opset=config.opset,
            input_names=["input_ids", "position_ids", *past_input_names(layout.num_layers)],
            output_names=["logits", *present_output_names(layout.num_layers)],
            onnx_file=ONNX_FILE,
            eos_token_ids=eos_token_ids_of(tokenizer_dir, model.config) if vocab is None else eos_token_ids(tokenizer_dir, layout.vocab_size),
            source_model_dir=str(model_dir),
            parity_steps=config.parity_steps,
            exporter=f"torch.onnx {config.exporter}, torch {torch.__version__}, transformers {transformers.__version__}",
            target=target,
            draft_vocab_size=vocab.draft_vocab_size if vocab is not None else 0,
        )
        log(f"[3/5] parity check: {config.parity_steps} cached greedy steps, torch vs ONNX Runtime")
        parity = check_parity(model, staging / ONNX_FILE, manifest, _parity_prompt(tokenizer, layout.vocab_size), config.parity_steps)
        verdict = "ok" if parity.passes(config.tolerance, config.prob_tolerance) else "FAILED"
        log(
            f"      max |logit diff| = {parity.max_abs_diff:.3g} = {parity.max_rel_diff:.3g} of max |logit| (tolerance "
            f"{config.tolerance:g}), max |prob diff| = {parity.max_prob_diff:.3g} (tolerance {config.prob_tolerance:g}), "
            f"greedy tokens match: {parity.greedy_match} -> {verdict}"
        )
        if verdict != "ok":
            where = f"; first greedy mismatch at step {parity.first_mismatch}" if not parity.greedy_match else ""
            raise ParityError(
                f"ONNX Runtime disagrees with torch: max |logit diff| {parity.max_rel_diff:.3g} of the logits' scale vs "
                f"tolerance {config.tolerance:g}, max |prob diff| {parity.max_prob_diff:.3g} vs {config.prob_tolerance:g}{where}. "
                f"Try the other exporter (--exporter) or another --opset"
            )
        manifest.parity_max_abs_diff = parity.max_abs_diff
        manifest.parity = {"max_rel_diff": parity.max_rel_diff, "max_prob_diff": parity.max_prob_diff}
        if config.quantize == "int8":
            log("[3b/5] quantising the weights to int8 (onnxruntime.quantization, dynamic)")
            manifest.quantization = "int8"
            manifest.parity["int8"] = quantize_int8(staging, manifest, _parity_prompt(tokenizer, layout.vocab_size),
                                                    config.parity_steps, keep_fp32=config.keep_fp32)
            log(f"      int8 vs float graph: {manifest.parity['int8']}")
        manifest.onnx_sha256, manifest.external_data = graph_hashes(staging, ONNX_FILE)
        log("[4/5] writing manifest.json")
        manifest.save(staging)
        log(f"[5/5] moving into {out_dir}")
        _move_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportReport(out_dir, out_dir / ONNX_FILE, manifest, parity, time.perf_counter() - started)


def _target_record(target_dir: Path | None, tokenizer_dir: Path) -> dict:
    """What the manifest says the draft was made for: the target's name and tokenizer fingerprint."""
    if target_dir is None:
        return {}
    if not (target_dir / TOKENIZER_FILE).is_file():
        raise ExportError(f"--target {target_dir} has no {TOKENIZER_FILE}")
    ours, theirs = fingerprint(tokenizer_dir), fingerprint(target_dir)
    if ours != theirs:
        raise ExportError(f"the draft's tokenizer ({ours}) is not the target's ({theirs}): the verifier would refuse "
                          f"every session; give the draft the target's tokenizer (or a {DRAFT_VOCAB_FILE} mapping)")
    return {"name": target_dir.name, "tokenizer_fingerprint": theirs}


def graph_hashes(out_dir: Path, onnx_file: str) -> tuple[str, dict[str, str]]:
    """sha256 of the graph and of each external-data file it references."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo

    graph = onnx.load(str(out_dir / onnx_file), load_external_data=False)
    external = (t for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    locations = sorted({ExternalDataInfo(t).location for t in external})
    return sha256_file(out_dir / onnx_file), {name: sha256_file(out_dir / name) for name in locations}


def quantize_int8(out_dir: Path, manifest: DraftManifest, prompt: list[int], steps: int, *, keep_fp32: bool) -> dict:
    """Replaces ``model.onnx`` by its dynamic-int8 version; returns how the two agree greedily."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    float_path, int8_path = out_dir / FLOAT_ONNX_FILE, out_dir / ".int8.onnx"
    (out_dir / ONNX_FILE).rename(float_path)
    large = sum(p.stat().st_size for p in out_dir.iterdir() if p.name.startswith(ONNX_FILE)) > _EXTERNAL_DATA_BYTES
    with _quiet_exporter():
        # NOTE: matrix products only. A quantised embedding Gather dequantises the whole table on
        # every call: SmolLM2's first 4 layers drafted at 63 ms/token that way, 17 with MatMul
        # only, 31 in float (1 thread, this CPU).
        quantize_dynamic(str(float_path), str(int8_path), weight_type=QuantType.QInt8, use_external_data_format=large,
                         op_types_to_quantize=list(INT8_OP_TYPES))
    int8_path.rename(out_dir / ONNX_FILE)
    agreement = greedy_agreement(float_path, out_dir / ONNX_FILE, manifest, prompt, steps)
    if not keep_fp32:
        for path in out_dir.iterdir():
            if path.name.startswith(FLOAT_ONNX_FILE):
                path.unlink()
    return agreement


def greedy_agreement(reference: Path, candidate: Path, manifest: DraftManifest, prompt: list[int], steps: int) -> dict:
    """Greedy-decodes ``steps`` tokens with ``reference`` and counts where ``candidate``'s argmax agrees."""
    runs = [GraphRunner(open_session(path, threads=1), manifest) for path in (reference, candidate)]
    chunk, agree, max_prob = list(prompt), 0, 0.0
    for _ in range(steps):
        want, got = (runner.feed(chunk)[-1] for runner in runs)
        agree += int(want.argmax() == got.argmax())
        max_prob = max(max_prob, float(np.abs(_softmax(want) - _softmax(got)).max()))
        chunk = [int(want.argmax())]
    return {"greedy_agreement": agree / steps, "max_prob_diff": max_prob, "steps": steps}


def _move_into_place(staging: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        staging.rename(out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}.old-{staging.name.rsplit('.', 2)[-2]}")
    out_dir.rename(old)
    staging.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)
