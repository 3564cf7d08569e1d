"""The ship stage of ``edgespec make-draft``: the small artefacts of a draft, and its model card.

Layout of the ship directory (``--ship``; the real pair's is ``models/smollm2-135m``)::

    draft/         the int8 ONNX draft for the device (model.onnx, tokenizer, chat template,
                   generation config, manifest); NOT committed: ``make setup`` exports it from draft-hf/
    draft-hf/      the distilled draft in fp16 with its draft vocabulary: the source to re-export
                   (its tokenizer.json, the target's, is copied in by ``make setup``)
    metrics.json   sizes, data, training, the held-out figures (eval stage), the commands
    README.md      the model card, written from metrics.json
    target/        NOT committed: the imported target (``make setup`` imports it)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from transformers import AutoModelForCausalLM



def _target_source(target: Path) -> dict:
    """Where an imported target came from (``gguf_source.json``, written by ``edgespec import-gguf``)."""
    path = target / "gguf_source.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _target_name(target: Path, target_config: dict) -> str:
    source_file = _target_source(target).get("source_file")
    if source_file:
        return source_file.split(".")[0]  # "SmolLM2-135M-Instruct.Q4_1.gguf"
    return str(target_config.get("_name_or_path") or target.name)


def _rebuild(config) -> list[str]:
    source = _target_source(config.target).get("source_package")
    steps = [f"edgespec import-gguf {source.split('==')[0]} --out {config.target}"] if source else []
    return steps + [f"edgespec make-draft --target {config.target} --out {config.out} --ship {config.ship}"]


def _readouts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def ship_draft(config) -> dict:
    from edgespec.cloud.training.target_replies import chunks, load_replies
    from edgespec.cloud.training.distill_replies import SETTINGS
    from edgespec.cloud.training.draft_vocab import DRAFT_VOCAB_FILE

    ship, out = config.ship, config.out
    ship.mkdir(parents=True, exist_ok=True)
    final = out / "distill" / "final"
    draft = cast(Any, AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32, local_files_only=True))
    params = sum(p.numel() for p in draft.parameters())
    shutil.rmtree(ship / "draft-hf", ignore_errors=True)
    draft.to(torch.float16).save_pretrained(ship / "draft-hf")
    for path in final.iterdir():
        if path.is_file() and not path.name.endswith((".safetensors", ".pt")) and path.name not in ("config.json", "trainer_state.json"):
            shutil.copyfile(path, ship / "draft-hf" / path.name)
    shutil.rmtree(ship / "draft", ignore_errors=True)
    shutil.copytree(out / "export" / "int8", ship / "draft")
    replies = list(load_replies(out / "replies"))
    readouts = _readouts(out / "distill" / "readouts.jsonl")
    settings = json.loads((out / "distill" / SETTINGS).read_text())
    vocab_stats = json.loads((out / "draft-init" / "vocab_stats.json").read_text())
    target_config = json.loads((config.target / "config.json").read_text())
    metrics = {
        "target": {"dir": str(config.target), "name": _target_name(config.target, target_config),
                   "source": _target_source(config.target), "layers": target_config.get("num_hidden_layers"),
                   "hidden": target_config.get("hidden_size"), "vocab": target_config.get("vocab_size")},
        "draft": {"params": params, "layers_from_target": list(config.layers), "vocab": len(json.loads(
            (final / DRAFT_VOCAB_FILE).read_text())["draft_to_target"]),
            "vocab_coverage_of_training_text": vocab_stats["coverage_of_training_text"]},
        "data": {"replies": len(replies), "reply_tokens": int(sum(len(r[1]) for r in replies)),
                 "prompt_tokens": int(sum(len(r[0]) for r in replies)), "chunks": len(chunks(out / "replies"))},
        "distill": {"readout_start": readouts[0] if readouts else None, "readout_end": readouts[-1] if readouts else None,
                    **{k: settings.get(k) for k in ("minutes", "lr", "text_share", "window_len", "batch_sequences")},
                    "text_tokens": int(np.load(settings["text"], mmap_mode="r").shape[0]) if settings.get("text") else 0},
        "curve": json.loads((out / "distill" / "curve.json").read_text()) if (out / "distill" / "curve.json").is_file() else [],
        "eval": json.loads((out / "eval" / "metrics.json").read_text()) if (out / "eval" / "metrics.json").is_file() else None,
        "rebuild": _rebuild(config),
    }
    (ship / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (ship / "README.md").write_text(model_card(metrics))
    print(f"ship: {ship} (draft {params / 1e6:.1f}M params)", file=sys.stderr)
    return metrics


def model_card(m: dict) -> str:
    e, d, data, dist = m.get("eval") or {}, m["draft"], m["data"], m["distill"]
    start, end = dist["readout_start"] or {}, dist["readout_end"] or {}
    covered = d["vocab_coverage_of_training_text"]
    coverage = ("every token the training text uses" if covered >= 1.0 else
                f"the most frequent in the training text, {covered:.4f} of its tokens")

    def fmt(x, digits=3):
        return "–" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))

    cost = e.get("draft_ms_per_token", {})
    ratio = e.get("draft_cost_vs_target_step", {})
    fp32, int8 = (e.get("onnx") or {}).get("fp32", {}), (e.get("onnx") or {}).get("int8", {})
    t, source = m["target"], m["target"].get("source") or {}
    origin = (f"imported from the `{source['source_package'].split('==')[0]}` package's GGUF ({source.get('source_file')}, "
              f"dequantised to fp32) by `edgespec import-gguf`" if source.get("source_package") else f"from `{t['dir']}`")
    curve = m.get("curve") or []
    curve_line = (f"On `prompts/chat-eval.jsonl` (40 hand-written requests, no generator's): greedy agreement "
                  f"{fmt(curve[0]['agreement'])} -> {fmt(curve[-1]['agreement'])}, tau at k=4 {fmt(curve[0]['tau'])} -> "
                  f"{fmt(curve[-1]['tau'])} (model only, `distill/curve.json`).\n\n" if curve else "")
    return f"""# {t.get('name', 'The target')} and its draft

**Target**: {t.get('name', '')} ({t['layers']} layers x {t['hidden']}, vocabulary {t['vocab']}), {origin}; not committed.

**Draft** (`draft-hf/`: fp16 weights and `draft_vocab.json`; `draft/`: int8 ONNX for the device,
exported from them by `make setup`, not committed):
{d['params'] / 1e6:.2f}M parameters, {len(d['layers_from_target'])} decoder layers started from the
target's layers {d['layers_from_target']}, a draft vocabulary of {d['vocab']} tokens ({coverage}, plus every
special token) whose rows of the target's embedding start its tied embedding. The
ONNX graph maps the target's ids in and gives logits over the full vocabulary out, so the
device and the verifier see an ordinary draft.

**Data**: the target's own greedy replies (bfloat16) to {data['replies']} generated
instructions ({data['reply_tokens']} reply tokens; {data['prompt_tokens']} prompt tokens of
context): chat requests composed from hand-written pieces (kinds of task, lengths, styles,
multi-turn), general chat (task templates x subjects, held-out subjects never trained on) and
code tasks from documented functions of the Python standard library (held-out files never
trained on). Distilled against the target's top-32 at each reply token (no teacher forward)
for {dist.get('minutes')} minutes ({end.get('step', '–')} steps, {end.get('tokens', '–')} trained positions, lr
{dist.get('lr')}); {dist.get('text_share')} of the steps read windows of the stdlib's source and documentation
({dist.get('text_tokens')} tokens) through the target in bfloat16 instead, against its top-32 there.

{curve_line}## Figures (held-out prompts, `prompts/chat-heldout.jsonl`, the target's float32 greedy replies)

| | before distillation | shipped |
|---|---|---|
| greedy agreement (corpus validation replies) | {fmt(start.get('agreement'))} | {fmt(end.get('agreement'))} |
| tau at k=4 (corpus validation replies) | {fmt(start.get('tau'))} | {fmt(end.get('tau'))} |

| held-out figure ({e.get('prompts', '–')} prompts, {e.get('reply_tokens', '–')} reply tokens) | ONNX fp32 | ONNX int8 |
|---|---|---|
| greedy agreement | {fmt(fp32.get('greedy_agreement'))} | {fmt(int8.get('greedy_agreement'))} |
| tau at k={e.get('k', 4)}, model only | {fmt(fp32.get('tau'))} | {fmt(int8.get('tau'))} |
| acceptance by position, model only | {' '.join(fmt(x, 2) for x in fp32.get('acceptance_by_position', []))} | {' '.join(fmt(x, 2) for x in int8.get('acceptance_by_position', []))} |
| ms per drafted token (ONNX Runtime, 1 thread) | {fmt(cost.get('fp32'), 2)} | {fmt(cost.get('int8'), 2)} |
| draft cost per drafted token / one target decode step | {fmt(ratio.get('fp32'))} | {fmt(ratio.get('int8'))} |

| | value |
|---|---|
| tau at k={e.get('k', 4)}, model + context lookup (torch fp32) | {fmt(e.get('tau_with_lookup'))} |
| acceptance by position, with lookup | {' '.join(fmt(x, 2) for x in e.get('acceptance_by_position_with_lookup', []))} |
| one target decode step, torch fp32 (1 thread) | {fmt(e.get('target_decode_step_ms'), 2)} ms |

tau is simulated with the verifier's greedy rule in torch (`edgespec make-draft --stages eval`);
through Serve, see `edgespec demo` and the README.

## Rebuild

```bash
{chr(10).join(m['rebuild'])}
```

Every stage resumes (`--stages replies` continues its chunks; `distill` its checkpoint). The ONNX
figures above were measured on the graph exported from the fp32 checkpoint; `make setup` exports
`draft/` from the fp16 `draft-hf/`, whose int8 graph guesses as that one did (greedy agreement with
the torch draft on 16 held-out prompts: 0.691 vs 0.692).
"""
