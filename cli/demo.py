"""``edgespec demo`` (``make demo``): the whole product on one machine (see edgespec.cloud.demo.run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgespec.cloud.demo.run import PAIRS, DemoConfig, run_demo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", choices=PAIRS, default="smollm2",
                        help="smollm2: the real pair (SmolLM2-135M-Instruct and its draft, models/smollm2-135m); "
                             "demo: the small pair trained here on the stdlib (models/demo) (default %(default)s)")
    parser.add_argument("--target", type=Path, help="target model dir (default: the pair's)")
    parser.add_argument("--draft", type=Path, help="ONNX draft dir (default: the pair's)")
    parser.add_argument("--prompt", help="prompt text (default: the first held-out prompt)")
    parser.add_argument("--prompt-index", type=int, default=0, help="which held-out prompt to use")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", default="auto", help="drafted tokens per round, or 'auto' (adaptive, the SDK default)")
    parser.add_argument("--timing-prompts", type=int, default=8, choices=range(1, 65), metavar="N",
                        help="held-out prompts to time, the streamed one first (1-64)")
    parser.add_argument("--repeats", type=int, default=1, choices=range(1, 101), metavar="N",
                        help="alternating speculative/cloud-only runs per timed prompt (1-100)")
    parser.add_argument("--grpc-port", type=int, default=9000)
    parser.add_argument("--peers", action="store_true",
                        help="also time transformers' own speculative decoding (prompt lookup, assisted generation) on the same prompts")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object last")


def run(args: argparse.Namespace) -> int:
    options = {k: v for k, v in vars(args).items() if k != "json"}
    figures = run_demo(DemoConfig(**options))
    if args.json:
        print(json.dumps(figures))
    return 0
