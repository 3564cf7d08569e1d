"""``edgespec make-draft``: make a draft for a chat target (see edgespec.cloud.training.make_draft)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgespec.cloud.training.chat_format import NoChatTemplate
from edgespec.cloud.training.device import DEVICES
from edgespec.cloud.training.make_draft import STAGES, MakeDraftConfig, make_draft


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = MakeDraftConfig.__dataclass_fields__
    parser.add_argument("--target", type=Path, required=True,
                        help="the chat target: a local Hugging Face directory with a chat template (see `edgespec import-gguf`)")
    parser.add_argument("--out", type=Path, default=d["out"].default, help="working directory of all stages (default %(default)s)")
    parser.add_argument("--ship", type=Path, default=None, help="where the small shipped artefacts go (default: OUT/ship)")
    parser.add_argument("--prompts", type=Path, default=d["prompts"].default, help="where the held-out and tuning prompt sets go")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of: %(default)s")
    parser.add_argument("--chat-template", type=Path, default=None,
                        help="a Jinja chat template file, for a target that ships none")
    parser.add_argument("--device", choices=DEVICES, default=d["device"].default,
                        help="where to train and generate (default %(default)s: the GPU if torch sees one)")
    parser.add_argument("--eval-set", type=Path, default=None,
                        help="the evaluation set of the distillation curve (default PROMPTS/chat-eval.jsonl, frozen)")
    parser.add_argument("--threads", type=int, default=d["threads"].default, help="torch threads (default %(default)s)")
    parser.add_argument("--replies", type=int, default=d["replies"].default, help="instructions to reply to (upper bound)")
    parser.add_argument("--replies-minutes", type=float, default=d["replies_minutes"].default, help="time budget of the replies stage (0: none)")
    parser.add_argument("--replies-batch", type=int, default=d["replies_batch"].default)
    parser.add_argument("--requests", type=int, default=d["requests"].default,
                        help="composed chat requests among the training instructions (0: the template generator only)")
    parser.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"].default, help="longest reply")
    parser.add_argument("--vocab-size", type=int, default=d["vocab_size"].default,
                        help="the draft vocabulary's size (default %(default)s)")
    parser.add_argument("--draft-layers", type=int, default=d["draft_layers"].default,
                        help="the draft's decoder layers, the target's first ones (default %(default)s)")
    parser.add_argument("--layers", default="", help="which of the target's layers the draft starts from (overrides --draft-layers)")
    parser.add_argument("--from-draft", type=Path, default=None,
                        help="train this draft further (a Hugging Face directory) instead of cutting one from the target")
    parser.add_argument("--distill-minutes", type=float, default=d["distill_minutes"].default,
                        help="distillation budget in minutes, in all sessions together (a resumed run goes on to it)")
    parser.add_argument("--distill-lr", type=float, default=d["distill_lr"].default)
    parser.add_argument("--text-share", type=float, default=d["text_share"].default,
                        help="share of distillation steps on stdlib text the target reads teacher-forced")
    parser.add_argument("--eval-prompts", type=int, default=d["eval_prompts"].default)


def run(args: argparse.Namespace) -> int:
    values = {k: v for k, v in vars(args).items() if k in MakeDraftConfig.__dataclass_fields__}
    values["stages"] = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    try:
        values["layers"] = tuple(int(x) for x in args.layers.split(",") if x.strip())
        config = MakeDraftConfig(**values)
    except ValueError as exc:
        print(f"edgespec make-draft: {exc}", file=sys.stderr)
        return 2
    try:
        make_draft(config)
    except NoChatTemplate as exc:
        print(f"edgespec make-draft: {exc}", file=sys.stderr)
        return 2
    return 0
