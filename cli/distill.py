"""``edgespec distill``: align a draft LM to a target LM by distillation (see edgespec.cloud.training.distill)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from edgespec.cli.flags import add_deprecated
from edgespec.cloud.training.distill import DistillConfig, distill
from edgespec.edge.settings import build_config, load_settings

_PATH_FIELDS = ("target", "draft", "data", "out", "validation", "corpus")
FLAG_NAMES = {"new_tokens": "--max-new-tokens"}  # the vocabulary (docs/cli.md); the config key stays new_tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML or JSON file of DistillConfig fields; flags given here override it")
    parser.add_argument("--target", type=Path, help="target model directory (Hugging Face causal LM)")
    parser.add_argument("--draft", type=Path, help="draft model directory to start from (same tokenizer)")
    parser.add_argument("--data", type=Path, help="training text: .bin ids, .jsonl with 'text', a text file or a directory")
    parser.add_argument("--out", type=Path, help="output directory (checkpoint/, final/, logs)")
    parser.add_argument("--validation", type=Path, help="validation text, same formats (default: last 5%% of --data)")
    parser.add_argument("--corpus", type=Path,
                        help="target-generated text made beforehand (edgespec train-demo --stages generate): "
                             "the --generated-fraction steps read it instead of generating")
    parser.add_argument("--resume", action="store_true", default=None, help="continue the checkpoint in --out")
    helps = {
        "minutes": "wall-clock budget (0: none)",
        "tokens": "budget in trained positions (0: none)",
        "temperature": "distillation temperature for KL(p_T || q_T)",
        "generated_fraction": "share of steps on target-generated continuations (0..1)",
        "generate_temperature": "0: greedy continuations; > 0: sampled at this temperature",
        "ce_weight": "weight of an added cross-entropy term on the next tokens",
        "new_tokens": "tokens the target generates per continuation (config key new_tokens)",
    }
    for f in fields(DistillConfig):
        if f.name in _PATH_FIELDS or f.name == "resume":
            continue
        kind = type(f.default)
        parser.add_argument(FLAG_NAMES.get(f.name, f"--{f.name.replace('_', '-')}"), dest=f.name, type=kind, default=None,
                            help=f"{helps.get(f.name, '')} (default {f.default})".strip())
    add_deprecated(parser, "--new-tokens", "--max-new-tokens", "new_tokens", convert=int)


def config_from_args(args: argparse.Namespace) -> DistillConfig:
    config_file = getattr(args, "config", None)
    values = load_settings(config_file) if config_file else {}
    values.update({k: v for k, v in vars(args).items() if k != "config" and v is not None})
    missing = [name for name in ("target", "draft", "data", "out") if values.get(name) is None]
    if missing:
        raise ValueError("missing required option(s): " + ", ".join(f"--{m}" for m in missing))
    return build_config(DistillConfig, values, str(config_file or "edgespec distill"))


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        report = distill(config)
    except (ValueError, FileExistsError, FileNotFoundError) as exc:
        print(f"edgespec distill: {exc}", file=sys.stderr)
        return 2
    print(f"distilled draft: {report.final_dir}")
    print(f"before: {report.before.summary()}")
    print(f"after:  {report.after.summary()}")
    return 0
