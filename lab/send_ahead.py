"""Send-ahead per link: "auto" against fixed depths, always speculating, on the same prompts.

    .venv/bin/python lab/send_ahead.py [--link loopback,wifi,5g,4g] [--prompt-limit 6]
        [--models models/demo] [--prompts prompts/heldout.jsonl] [--max-new-tokens 128]

Serves the target (CPU, the bench harness: HAProxy ingress, the link emulator), then per link
runs four always-speculating arms with adaptive k, each on a client of its own (warmed up with
one short request), the arms rotated prompt by prompt: one block in flight, ``send_ahead="auto"``
(the default) and fixed depths 2 and 4. Prints per arm ms/token, rounds, tau, mean k, the blocks
sent ahead that were verified and discarded, and what its planner ended with: the depth "auto"
would keep, the share of blocks sent ahead that held (- where none was sent), and a fresh and
a held round's predicted ms.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"1 in flight": 1, "auto": "auto", "2": 2, "4": 4}


def arm_line(name: str, results, client) -> str:
    stats = [result.stats for result in results]
    tokens, rounds = sum(s.generated for s in stats), sum(s.rounds for s in stats)
    ks = [k for s in stats for k in s.k_history]
    line = (f"  {name:12s} {1000 * sum(s.wall_s for s in stats) / tokens:6.2f} ms/token, {rounds} rounds, tau "
            f"{tokens / rounds:.2f}, mean k {sum(ks) / len(ks):.1f}, sent ahead: {sum(s.ahead_hits for s in stats)} "
            f"verified / {sum(s.discarded_blocks for s in stats)} discarded")
    planners = list(client._client._planners.values())  # (the client's planner, for what it ended with)
    if planners:
        from edgespec.edge.planner import forecast

        planner = planners[0]
        k, spec, depth = forecast(planner.state, planner.config)
        if spec is not None:
            _, holds = planner.state.acceptance.tokens_and_holds(planner.state.max_k)
            line += f"; auto's k {k}, depth {depth}, a block of k held with {holds[k]:.2f}, {spec:.1f} ms/token forecast"
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link", default="loopback,wifi,5g,4g", help="link profiles, comma-separated")
    parser.add_argument("--prompt-limit", type=int, default=6)
    parser.add_argument("--models", type=Path, default=ROOT / "models" / "demo", help="folder with target/ and draft/")
    parser.add_argument("--prompts", type=Path, default=ROOT / "prompts" / "heldout.jsonl")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    from edgespec.cloud.bench.harness import Harness, load_prompts
    from edgespec.cloud.link.profiles import get_profile
    from edgespec.edge.eos import chat_template_of

    prompts = load_prompts(args.prompts, args.prompt_limit, chat_template=chat_template_of(args.models / "draft"))
    with Harness(args.models / "target", args.models / "draft") as harness:
        harness.warm_up(prompts[0])
        for link in args.link.split(","):
            harness.use_link(get_profile(link))
            print(f"{link}:", flush=True)
            clients = {name: harness.new_client() for name in ARMS}
            try:
                params = {name: dict(k="auto", speculate=True, send_ahead=depth) for name, depth in ARMS.items()}
                for name, client in clients.items():
                    client.generate(prompts[0], **params[name], max_new_tokens=16)
                results: dict[str, list] = {name: [] for name in ARMS}
                names = list(ARMS)
                for i, prompt in enumerate(prompts):
                    for name in names[i % len(names):] + names[:i % len(names)]:
                        harness.pair_draws(f"{link}/prompt {i}")
                        results[name].append(clients[name].generate(
                            prompt, **params[name], max_new_tokens=args.max_new_tokens, stop_token_ids=(), seed=0))
                for name in ARMS:
                    print(arm_line(name, results[name], clients[name]), flush=True)
            finally:
                for client in clients.values():
                    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
