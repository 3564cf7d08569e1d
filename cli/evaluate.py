"""``edgespec evaluate``: offline figures of a draft/target pair (see edgespec.cloud.demo.evaluate).

Losses, KL, alpha, greedy agreement and the simulated acceptance length at k on held-out
data, before (and without) the serving stack.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from edgespec.cli.flags import add_deprecated
from edgespec.cloud.demo.evaluate import EvalConfig, evaluate_pair


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, default=Path("runs/demo/data"), help="holds validation.bin and heldout.bin")
    parser.add_argument("--prompts", type=Path, default=Path("prompts/heldout.jsonl"))
    parser.add_argument("--max-prompts", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt (default %(default)s)")
    add_deprecated(parser, "--new-tokens", "--max-new-tokens", "max_new_tokens", convert=int)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")


def run(args: argparse.Namespace) -> int:
    config = EvalConfig(args.target, args.draft, args.data_dir, args.prompts, max_prompts=args.max_prompts,
                        k=args.k, new_tokens=args.max_new_tokens, threads=args.threads)
    result = evaluate_pair(config)
    print(result.summary())
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=1) + "\n")
    return 0

