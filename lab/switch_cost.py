"""What leaving speculation for the stream costs, measured: a switch forced at a fixed token
against a cloud-only request of the same text, over an emulated link.

Per text, with the link's draws paired across the arms (``Harness.pair_draws``): a cloud-only
request, and a k=auto request made to speculate until ``--at`` tokens and then stream (its
planner's ``decide`` forced). Printed per text: the gap from the switch to the first
streamed token against what the planner prices a switch at (``switch_cost_ms``: round trip +
the replica's prefill), and the stream's rate after the switch against the cloud-only
request's over the same tokens. lab/README.md says what it found.

    .venv/bin/python lab/switch_cost.py [--link 5g] [--texts 6] [--at 48]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from demo_link import run_on_link

from edgespec.cloud.bench.harness import Harness
from edgespec.edge.aclient import AsyncEdgeClient
from edgespec.edge.params import GenerationParams
from edgespec.edge.planner import Decision, Path, Planner, switch_cost_ms

NEW_TOKENS = 128


class SwitchAt(Planner):
    """Speculates from the start and streams from ``at`` generated tokens on; notes the switch
    cost it would have priced at that moment."""

    at = 48
    priced_ms: float | None = None

    def decide(self, current: Path | None, remaining: int) -> Decision:
        decision = super().decide(current, remaining)
        if current is None:
            self.priced_ms = None
            return replace(decision, path=Path.SPECULATIVE)
        if current == Path.SPECULATIVE and NEW_TOKENS - remaining >= self.at:
            self.priced_ms = switch_cost_ms(self.state, self.config)
            return replace(decision, path=Path.CLOUD_ONLY)
        return replace(decision, path=current)


async def timed(client: AsyncEdgeClient, prompt: str, **params) -> tuple[list[tuple[float, int]], object]:
    """(seconds since the request, tokens so far) at every piece, and the stream (its result, segments)."""
    stream, marks, start = client.stream(prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=(), **params), [], time.perf_counter()
    async for _ in stream:
        marks.append((time.perf_counter() - start, len(stream.token_ids)))
    return marks, stream


def time_at(marks: list[tuple[float, int]], tokens: int) -> float:
    """When the request first had at least ``tokens`` tokens."""
    return next(t for t, n in marks if n >= tokens)


async def probe(harness: Harness, prompts: list[str], args: argparse.Namespace) -> None:
    at = args.at
    async with AsyncEdgeClient(harness.address, str(harness.draft), timeout=120) as client:
        await client.generate(prompts[0], max_new_tokens=16)  # as the benchmarks warm a client up
        planner = await client.planner(GenerationParams(max_new_tokens=NEW_TOKENS, stop_token_ids=()))
        planner.__class__ = SwitchAt
        planner.at = at
        for i, prompt in enumerate(prompts):
            harness.pair_draws(f"switch/prompt {i}")
            cloud, _ = await timed(client, prompt, speculate=False)
            harness.pair_draws(f"switch/prompt {i}")
            forced, stream = await timed(client, prompt)
            spoken = [n for _, n in forced]
            left = next(n for n in spoken if n >= at)  # the tokens when the switch was made
            first_streamed = next(n for n in spoken if n > left)
            gap_ms = (time_at(forced, first_streamed) - time_at(forced, left)) * 1000
            after = (forced[-1][0] - time_at(forced, first_streamed)) * 1000 / max(spoken[-1] - first_streamed, 1)
            cloud_after = (cloud[-1][0] - time_at(cloud, first_streamed)) * 1000 / max(cloud[-1][1] - first_streamed, 1)
            print(f"text {i + 1}: switched at {left} ({stream.segments}); first streamed token {gap_ms:.0f} ms later "
                  f"(priced {planner.priced_ms or 0:.0f} ms); then {after:.1f} ms/token, the cloud-only request "
                  f"{cloud_after:.1f} over the same tokens; whole: {forced[-1][0] * 1000 / spoken[-1]:.1f} against "
                  f"{cloud[-1][0] * 1000 / cloud[-1][1]:.1f} ms/token", flush=True)


def main() -> int:
    return run_on_link(__doc__.split("\n\n")[0].replace("\n", " "), probe, link="5g", texts=6, add_arguments=lambda parser: parser.add_argument(
        "--at", type=int, default=48, help="tokens speculated before the switch"))


if __name__ == "__main__":
    sys.exit(main())
