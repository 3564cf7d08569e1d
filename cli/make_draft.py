"""``edgespec make-draft``: make a draft for a real chat target (see edgespec.cloud.training.make_draft)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgespec.cloud.training.make_draft import STAGES, MakeDraftConfig, make_draft


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = MakeDraftConfig.__dataclass_fields__
    parser.add_argument("--target", type=Path, required=True, help="the target: a local Hugging Face directory (see `edgespec import-gguf`)")
    parser.add_argument("--out", type=Path, default=d["out"].default, help="working directory of all stages (default %(default)s)")
    parser.add_argument("--ship", type=Path, default=d["ship"].default, help="where the small shipped artefacts go (default %(default)s)")
    parser.add_argument("--prompts", type=Path, default=d["prompts"].default, help="where the held-out and tuning prompt sets go")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of: %(default)s")
    parser.add_argument("--threads", type=int, default=d["threads"].default, help="torch threads (default %(default)s)")
    parser.add_argument("--replies", type=int, default=d["replies"].default, help="instructions to reply to (upper bound)")
    parser.add_argument("--replies-minutes", type=float, default=d["replies_minutes"].default, help="time budget of the replies stage (0: none)")
    parser.add_argument("--replies-batch", type=int, default=d["replies_batch"].default)
    parser.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"].default, help="longest reply")
    parser.add_argument("--vocab-size", type=int, default=d["vocab_size"].default, help="the draft vocabulary's size")
    parser.add_argument("--layers", default=",".join(map(str, d["layers"].default)), help="the target's layers the draft starts from")
    parser.add_argument("--distill-minutes", type=float, default=d["distill_minutes"].default)
    parser.add_argument("--distill-lr", type=float, default=d["distill_lr"].default)
    parser.add_argument("--text-share", type=float, default=d["text_share"].default,
                        help="share of distillation steps on stdlib text the target reads teacher-forced")
    parser.add_argument("--eval-prompts", type=int, default=d["eval_prompts"].default)


def run(args: argparse.Namespace) -> int:
    values = {k: v for k, v in vars(args).items() if k in MakeDraftConfig.__dataclass_fields__}
    values["stages"] = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    try:
        values["layers"] = tuple(int(x) for x in args.layers.split(","))
        config = MakeDraftConfig(**values)
    except ValueError as exc:
        print(f"edgespec make-draft: {exc}", file=sys.stderr)
        return 2
    make_draft(config)
    return 0
