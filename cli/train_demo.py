"""``edgespec train-demo``: the reproducible pipeline that builds the demo pair (see edgespec.cloud.demo.train)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgespec.cloud.demo.models import DRAFT_SHAPES, TARGET_SHAPES
from edgespec.cloud.demo.train import STAGES, TrainDemoConfig, train_demo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainDemoConfig()
    parser.add_argument("--out", type=Path, default=d.out, help="working directory for all stages (default %(default)s)")
    parser.add_argument("--ship", type=Path, default=d.ship, help="where the small shipped artefacts go (default %(default)s)")
    parser.add_argument("--prompts", type=Path, default=d.prompts, help="where prompt files are copied (default %(default)s)")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of: %(default)s")
    parser.add_argument("--resume", action="store_true", help="continue checkpoints and reuse finished stages")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads per stage (default %(default)s)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--target-shape", choices=sorted(TARGET_SHAPES), default=d.target_shape)
    parser.add_argument("--target-minutes", type=float, default=d.target_minutes, help="wall-clock budget (0: none)")
    parser.add_argument("--target-tokens", type=int, default=d.target_tokens, help="token budget (0: none); the first budget reached ends the stage")
    parser.add_argument("--target-lr", type=float, default=d.target_lr)
    parser.add_argument("--draft-shape", choices=sorted(DRAFT_SHAPES), default=d.draft_shape)
    parser.add_argument("--draft-init", type=Path, default=None,
                        help="start the draft from this model directory, grown to --draft-shape (default: random weights)")
    parser.add_argument("--draft-minutes", type=float, default=d.draft_minutes)
    parser.add_argument("--draft-tokens", type=int, default=d.draft_tokens)
    parser.add_argument("--draft-lr", type=float, default=d.draft_lr)
    parser.add_argument("--generate-minutes", type=float, default=d.generate_minutes, help="wall-clock budget of the generate stage")
    parser.add_argument("--generate-sequences", type=int, default=d.generate_sequences,
                        help="sequences of target text to generate (the first budget reached ends the stage)")
    parser.add_argument("--distill-minutes", type=float, default=d.distill_minutes)
    parser.add_argument("--distill-temperature", type=float, default=d.distill_temperature)
    parser.add_argument("--distill-generated-fraction", type=float, default=d.distill_generated_fraction,
                        help="share of distillation batches that are target-generated continuations")
    parser.add_argument("--distill-ce-weight", type=float, default=d.distill_ce_weight,
                        help="weight of a cross-entropy term on the next tokens, added to KL (default %(default)s)")
    parser.add_argument("--eval-prompts", type=int, default=d.eval_prompts)


def run(args: argparse.Namespace) -> int:
    values = {k: v for k, v in vars(args).items() if k in TrainDemoConfig.__dataclass_fields__}
    values["stages"] = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    try:
        config = TrainDemoConfig(**values)
    except ValueError as exc:
        print(f"edgespec train-demo: {exc}", file=sys.stderr)
        return 2
    train_demo(config)
    return 0

