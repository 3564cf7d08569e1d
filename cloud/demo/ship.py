"""The last stage of ``edgespec train-demo``: copy the small artefacts that get committed.

Layout of the ship directory (default ``models/demo``)::

    target/        fp16 safetensors + config, tokenizer, generation config (~12 MB)
    draft-hf/      the distilled draft in fp32 (~3 MB), the source for ONNX re-export
    metrics.json   shapes, parameter counts, tokens, training time, losses, alignment figures,
                   tokenizer fingerprint, corpus split digest and the commands that rebuild it

fp16 halves the target for the repository; the verifier upcasts or runs it as it likes. The
draft stays fp32 so the ONNX export starts from the trained weights exactly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from edgespec.cloud.demo.models import param_count
from edgespec.cloud.training import STATE_FILE, checkpoint_exists
from edgespec.edge.tokenizer import fingerprint, load_tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _copy_model(src: Path, dst: Path, dtype: torch.dtype) -> int:
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    eos = model.config.eos_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, max_length=model.config.max_position_embeddings, do_sample=False
    )
    model = model.to(dtype)
    shutil.rmtree(dst, ignore_errors=True)
    model.save_pretrained(str(dst))
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    return param_count(model)


def _trainer_summary(model_dir: Path) -> dict:
    state = json.loads((model_dir / STATE_FILE).read_text())
    summary = {"steps": state["step"], "tokens": state["tokens"], "minutes": round(state["elapsed_s"] / 60, 1)}
    evals = state.get("evals") or []
    if evals:
        summary["val_loss"] = evals[-1]["val_loss"]
    readouts = state.get("readouts") or []
    if readouts:
        summary["readout_before"], summary["readout_after"] = readouts[0], readouts[-1]
    return summary


def ship(out: Path, ship_dir: Path) -> dict:
    """Copies target, draft and metrics from a train-demo ``out`` directory into ``ship_dir``."""
    out, ship_dir = Path(out), Path(ship_dir)
    target_src = out / "target" / "final"
    draft_src = out / "distill" / "final"
    if not checkpoint_exists(draft_src):
        draft_src = out / "draft" / "final"
        print(f"ship: no distilled draft in {out / 'distill' / 'final'}; shipping the pretrained draft {draft_src}")
    for path in (target_src, draft_src):
        if not checkpoint_exists(path):
            raise FileNotFoundError(f"{path} is missing: run the earlier train-demo stages first")
    ship_dir.mkdir(parents=True, exist_ok=True)
    target_params = _copy_model(target_src, ship_dir / "target", torch.float16)
    draft_params = _copy_model(draft_src, ship_dir / "draft-hf", torch.float32)

    manifest = json.loads((out / "data" / "manifest.json").read_text())
    invocations = out / "train_demo_invocations.jsonl"
    eval_file = out / "eval" / "metrics.json"
    metrics = {
        "tokenizer_fingerprint": fingerprint(load_tokenizer(ship_dir / "target")),
        "corpus": {k: manifest[k] for k in ("python_version", "split_digest", "tokens", "bytes", "fractions")},
        "target": {"params": target_params, "dtype": "float16", "source": str(target_src),
                   "config": json.loads((target_src / "config.json").read_text()), **_trainer_summary(target_src)},
        "draft_pretrained": _trainer_summary(out / "draft" / "final") if checkpoint_exists(out / "draft" / "final") else None,
        "draft": {"params": draft_params, "dtype": "float32", "source": str(draft_src), **_trainer_summary(draft_src)},
        "eval": json.loads(eval_file.read_text()) if eval_file.is_file() else None,
        "train_demo_invocations": [json.loads(line) for line in invocations.read_text().splitlines()] if invocations.is_file() else [],
    }
    if fingerprint(load_tokenizer(ship_dir / "draft-hf")) != metrics["tokenizer_fingerprint"]:
        raise RuntimeError("shipped target and draft tokenizers differ; refusing to ship a mismatched pair")
    (ship_dir / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    print(f"ship: {ship_dir}/target ({target_params:,} params, fp16), {ship_dir}/draft-hf ({draft_params:,} params), metrics.json")
    return metrics
