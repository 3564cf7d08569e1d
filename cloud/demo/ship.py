"""The last stage of ``edgespec train-demo``: copy the small artefacts that get committed.

Layout of the ship directory (default ``models/demo``)::

    target/        fp16 safetensors + config, tokenizer, generation config (~12 MB)
    draft-hf/      the distilled draft in fp32 (~3 MB), the source for ONNX re-export
    draft/         NOT committed: the ONNX draft, exported by the export stage or ``make setup``
    metrics.json   shapes, parameter counts, tokens, training time, losses, alignment figures,
                   tokenizer fingerprint, corpus split digest and the commands that rebuild it
    README.md      the model card, written from metrics.json

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
from edgespec.cloud.training.loop import STATE_FILE, checkpoint_exists
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
    if state.get("history"):  # how a model shipped before this pipeline kept its trainer state was made
        summary["history"] = state["history"]
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
    runs = [json.loads(line) for line in invocations.read_text().splitlines()] if invocations.is_file() else []
    eval_file = out / "eval" / "metrics.json"
    grown_from = next((r["draft_init"] for r in reversed(runs) if "draft" in r.get("stages", []) and r.get("draft_init")), None)
    draft_init = None
    if grown_from:
        init_dir = Path(grown_from)
        draft_init = {"source": grown_from, "layers": json.loads((init_dir / "config.json").read_text())["num_hidden_layers"]}
        if checkpoint_exists(init_dir):
            draft_init.update(_trainer_summary(init_dir))
    target_text = out / "target-text" / "meta.json"
    metrics = {
        "tokenizer_fingerprint": fingerprint(load_tokenizer(ship_dir / "target")),
        "corpus": {k: manifest[k] for k in ("python_version", "split_digest", "tokens", "bytes", "fractions")},
        "target": {"params": target_params, "dtype": "float16", "source": str(target_src),
                   "config": json.loads((target_src / "config.json").read_text()), **_trainer_summary(target_src)},
        "draft_pretrained": _trainer_summary(out / "draft" / "final") if checkpoint_exists(out / "draft" / "final") else None,
        "draft_init": draft_init,
        "target_text": _target_text_summary(out / "target-text") if target_text.is_file() else None,
        "draft": {"params": draft_params, "dtype": "float32", "source": str(draft_src),
                  "config": json.loads((draft_src / "config.json").read_text()), **_trainer_summary(draft_src)},
        "eval": json.loads(eval_file.read_text()) if eval_file.is_file() else None,
        "train_demo_invocations": runs,
    }
    if fingerprint(load_tokenizer(ship_dir / "draft-hf")) != metrics["tokenizer_fingerprint"]:
        raise RuntimeError("shipped target and draft tokenizers differ; refusing to ship a mismatched pair")
    (ship_dir / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (ship_dir / "README.md").write_text(model_card(metrics))
    print(f"ship: {ship_dir}/target ({target_params:,} params, fp16), {ship_dir}/draft-hf ({draft_params:,} params), metrics.json")
    return metrics


def _target_text_summary(directory: Path) -> dict:
    from edgespec.cloud.training.target_text import META, load_target_text

    meta = json.loads((directory / META).read_text())
    sequences = load_target_text(directory)[0].shape[0]
    return {**meta, "sequences": sequences, "generated_tokens": sequences * int(meta["new_tokens"])}


def _fmt(value, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def model_card(metrics: dict) -> str:
    """The demo pair's model card (markdown) from the shipped ``metrics.json``."""
    target, draft, corpus = metrics["target"], metrics["draft"], metrics["corpus"]
    config = target["config"]
    pre = metrics.get("draft_pretrained") or {}
    evals = metrics.get("eval") or {}
    distilled, pretrained = evals.get("distilled") or {}, evals.get("pretrained") or {}
    before, after = draft.get("readout_before") or {}, draft.get("readout_after") or {}
    distill_runs = [i for i in metrics.get("train_demo_invocations", []) if "distill" in i.get("stages", [])]
    generated = distill_runs[-1]["distill_generated_fraction"] if distill_runs else None
    ce_weight = distill_runs[-1].get("distill_ce_weight") if distill_runs else None
    layers = draft["config"]["num_hidden_layers"]
    layer_words = {1: "one-layer", 2: "two-layer", 3: "three-layer"}.get(layers, f"{layers}-layer")
    init, text = metrics.get("draft_init"), metrics.get("target_text")
    lines = [
        "# edgespec demo pair",
        "",
        "A draft/target pair trained on this machine's CPU for the demo and the benchmarks: a deep,",
        f"narrow Llama-architecture **target** served by the verifier, and a {layer_words} **draft**",
        "distilled towards it, run on the device in ONNX Runtime. Both share one byte-level BPE",
        f"tokenizer (fingerprint `{metrics['tokenizer_fingerprint']}`). Trained from scratch; no hub weights.",
        "",
        "| | target (`target/`) | draft (`draft/` ONNX, `draft-hf/` torch) |",
        "|---|---|---|",
        f"| shape | {config['num_hidden_layers']} layers x {config['hidden_size']} hidden, "
        f"{config['num_attention_heads']} heads | {layers} layer{'s' if layers > 1 else ''} x "
        f"{draft['config']['hidden_size']} hidden, {draft['config']['num_attention_heads']} heads |",
        f"| parameters | {target['params']:,} | {draft['params']:,} |",
        f"| weights | {target['dtype']} safetensors | {draft['dtype']} (ONNX and safetensors) |",
        f"| context | {config['max_position_embeddings']} tokens | same |",
        f"| pretraining | {target['tokens']:,} tokens, {target['minutes']} min | "
        f"{pre.get('tokens', 0):,} tokens, {pre.get('minutes', 'n/a')} min |",
        f"| validation loss (nats/token) | {_fmt(target.get('val_loss'))} | "
        f"{_fmt(pre.get('val_loss'))} pretrained, {_fmt(distilled.get('draft_val_loss'))} distilled |",
        "",
        "## Data",
        "",
        f"The Python {corpus['python_version']} standard library's source, split **by file** (a hash of the path)",
        f"into train / validation / held-out ({100 - sum(corpus['fractions'].values())}/"
        f"{corpus['fractions']['validation_percent']}/{corpus['fractions']['heldout_percent']} %): "
        f"{corpus['tokens']['train']:,} / {corpus['tokens']['validation']:,} / {corpus['tokens']['heldout']:,} tokens.",
        "Held-out files are never used for training, distillation or tuning; `prompts/heldout.jsonl` is cut",
        f"from them and `prompts/tuning.jsonl` from validation files. Split digest `{corpus['split_digest'][:16]}...`",
        "(in `prompts/stdlib-split.json` with the file lists).",
        "",
    ]
    if init:
        history = init.get("history") or {}
        lines += [
            f"The draft's pretraining started from `{init['source']}`, a {init['layers']}-layer draft"
            + (f" ({history['summary']})" if history.get("summary") else "")
            + f", grown to {layers} layers (`edgespec.cloud.demo.models.grow`: the new layers start with zero output "
            "projections, so the grown model computes what the old one did until training moves them).",
        ]
    lines += [
        "",
        "## Alignment",
        "",
        "The draft is distilled towards the target (`edgespec distill`): KL(p||q) on the target's logits"
        + (f" plus {ce_weight} x cross-entropy on the next tokens" if ce_weight else "")
        + ("." if generated is None else
           f", {generated:.0%} of the batches on the target's own greedy continuations, the rest on training text."),
        "",
    ]
    if text:
        lines += [
            f"The continuations were generated once (`--stages generate`): {text['sequences']:,} windows of "
            f"{text['prompt_len']} training tokens, each continued by {text['new_tokens']} greedy target tokens "
            f"({text['generated_tokens']:,} target tokens), read at random by the distillation steps.",
            "",
        ]
    lines += [
        "| readout (validation) | before distillation | after |",
        "|---|---|---|",
    ]
    for key, label in (("kl", "KL(p‖q)"), ("alpha", "alpha = E[sum min(p, q)], T=1"), ("greedy_agreement", "greedy agreement"),
                       ("generated_alpha", "alpha on target-generated text"), ("generated_agreement", "greedy agreement on target-generated text")):
        lines.append(f"| {label} | {_fmt(before.get(key))} | {_fmt(after.get(key))} |")
    if draft.get("minutes") is not None:
        lines += ["", f"Distillation: {draft.get('tokens', 0):,} positions in {draft['minutes']} min."]
    if distilled:
        lines += [
            "",
            "## On held-out data (`edgespec train-demo --stages eval`)",
            "",
        ]
        replaced = ((init or {}).get("history") or {}).get("eval") or {}
        lines += (["| | draft it replaced (grown from) | pretrained draft | distilled draft |", "|---|---|---|---|"] if replaced
                  else ["| | pretrained draft | distilled draft |", "|---|---|---|"])
        for key, label in (("target_heldout_loss", "target held-out loss"), ("draft_heldout_loss", "draft held-out loss"),
                           ("heldout_kl", "KL(p‖q)"), ("heldout_alpha", "alpha (T=1)"),
                           ("heldout_greedy_agreement", "greedy agreement"),
                           ("generated_alpha", "alpha on target-greedy continuations"),
                           ("generated_greedy_agreement", "greedy agreement on target-greedy continuations"),
                           ("tau", f"mean acceptance length at k={distilled.get('k')} (greedy, bonus included)"),
                           ("acceptance_rate", "acceptance rate"),
                           ("tau_with_lookup", "mean acceptance length with context lookup (as the device drafts)"),
                           ("acceptance_rate_with_lookup", "acceptance rate with context lookup")):
            first = f" {_fmt(replaced.get(key))} |" if replaced else ""
            lines.append(f"| {label} |{first} {_fmt(pretrained.get(key))} | {_fmt(distilled.get(key))} |")
        per_position = " ".join(f"{x:.2f}" for x in distilled.get("per_position_acceptance", []))
        lines += ["", f"Share of rounds whose i-th draft was accepted, i = 1..{distilled.get('k')} (distilled): {per_position}; "
                  f"{distilled.get('rounds')} rounds over {distilled.get('prompts')} held-out prompts, simulated in torch "
                  "with the verifier's greedy rule on the target's greedy continuations."]
    lines += [
        "",
        "Except for the two lookup rows, these figures are the draft model alone. On the device, greedy",
        "drafting also looks the context up (`edgespec.edge.lookup`: where the last tokens occurred",
        "before, it drafts what followed); end-to-end figures through Ray Serve",
        "(speedup, ms/token, acceptance with and without lookup, capacity, links) are in",
        "[docs/bench/report.md](../../docs/bench/report.md).",
        "",
        "## Rebuild",
        "",
        "```bash",
        "edgespec train-demo --out runs/demo --ship models/demo   # all stages; --stages/--resume to split it",
        "```",
        "",
        "`draft/`, the ONNX draft, is not committed: `make setup` exports it from `draft-hf/`.",
        "",
        "The invocations that built this copy (stages were run one at a time, some resumed) are in",
        "`metrics.json` under `train_demo_invocations`"
        + (f"; its draft was grown from `{init['source']}` (`--draft-init`), a from-scratch rebuild "
           "starts the draft from random weights and needs a longer `--draft-minutes` to match it" if init else "")
        + ". Limits: a small model of Python source, ~512-token",
        "context; it writes plausible standard-library-style code, not correct programs.",
        "",
    ]
    return "\n".join(lines)
