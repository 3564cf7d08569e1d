"""k=auto's speculative forecast at each text's start against what the text then did.

One k=auto client over held-out texts through an emulated link (a local Serve on the demo pair):
before each text, the forecast's parts (the k the policy reaches, E[tokens | k], the chance a
block sent ahead holds, the round's cost, the measured bias, the forecast in ms/token); after
it, what the request measured (ms/token, tokens per round, blocks sent ahead that held, the
path k=auto took). lab/README.md says what it found.

    .venv/bin/python lab/forecast_vs_texts.py [--link wifi] [--texts 8]
"""

from __future__ import annotations

import argparse
import sys

from demo_link import run_on_link

from edgespec.cloud.bench.harness import Harness
from edgespec.edge.aclient import AsyncEdgeClient
from edgespec.edge.planner import Planner, forecast


def forecast_parts(planner: Planner) -> str:
    state = planner.state
    k, spec, depth = forecast(state, planner.config)
    if spec is None:
        return "no forecast yet"
    tokens, holds = state.acceptance.tokens_and_holds(state.max_k)
    return (f"k {k}, E[tokens|k] {tokens[k]:.1f}, holds {holds[k]:.2f}, depth {depth}, "
            f"bias {state.bias.value or 1.0:.2f} -> {spec:.1f} ms/token")


async def probe(harness: Harness, prompts: list[str], args: argparse.Namespace) -> None:
    async with AsyncEdgeClient(harness.address, str(harness.draft), timeout=120) as client:
        await client.generate(prompts[0], max_new_tokens=16)  # as the benchmarks warm a client up
        for i, prompt in enumerate(prompts):
            planner = next(iter(client._planners.values()))
            before = forecast_parts(planner)
            stats = (await client.generate(prompt, max_new_tokens=128, stop_token_ids=())).stats
            held = f"{stats.ahead_hits}/{stats.ahead_hits + stats.discarded_blocks}"
            path = "; ".join(f"{d['to_path']} at {d['at_token']}" for d in stats.switch_log)
            print(f"text {i + 1}: forecast {before} | did {stats.ms_per_token:.1f} ms/token, "
                  f"{stats.mean_acceptance_length:.1f} tokens a round over {stats.rounds} rounds, {held} sent ahead held, "
                  f"{stats.cloud_only_tokens} streamed ({path})", flush=True)


def main() -> int:
    return run_on_link(__doc__.split("\n\n")[0].replace("\n", " "), probe, link="wifi", texts=8)


if __name__ == "__main__":
    sys.exit(main())
