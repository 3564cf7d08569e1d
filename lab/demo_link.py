"""What the probes of the demo pair over an emulated link share (``forecast_vs_texts.py``,
``switch_cost.py``): their flags, a local Serve on the demo pair warmed up on the first text,
the link in front of it, and the probe run on its event loop."""

from __future__ import annotations

import argparse
import asyncio
from typing import Awaitable, Callable

from edgespec.cloud.bench.harness import Harness, load_prompts
from edgespec.cloud.link.profiles import get_profile

Probe = Callable[[Harness, list[str], argparse.Namespace], Awaitable[None]]


def run_on_link(description: str, probe: Probe, *, link: str, texts: int,
                add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--link", default=link, help="link profile (edgespec link --help)")
    parser.add_argument("--texts", type=int, default=texts, help="held-out texts, in file order")
    parser.add_argument("--prompts", default="prompts/heldout.jsonl")
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args()
    prompts = load_prompts(args.prompts, args.texts)
    with Harness("models/demo/target", "models/demo/draft") as harness:
        harness.warm_up(prompts[0])
        harness.use_link(get_profile(args.link))
        asyncio.run(probe(harness, prompts, args))
    return 0
