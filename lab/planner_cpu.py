"""The planner's own CPU per round: k=auto over the demo pair, its decisions timed call by call.

    .venv/bin/python lab/planner_cpu.py [--link loopback] [--prompts 6] [--max-new-tokens 128]

On a near link every round asks the planner twice (``observe``, then ``decide``)
and a round is a few tens of milliseconds, so what the planner spends is a share of the
request that always speculating does not pay. Serves the demo target (CPU) through the bench
harness (HAProxy ingress, the link emulated), warms one client up with a short request, then
times each planner method the driver calls over the held-out prompts and prints, per method,
its calls and milliseconds (a method's time includes the planner methods it calls), and the
planner's time (outermost calls) per verified round and as a share of the wall time.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# The methods edge/driver.py (and the shadow) call on the planner.
METHODS = ("observe", "decide")


def timed(cls, names, spent: Counter, calls: Counter) -> list[float]:
    """Wraps each method of ``cls`` named in ``names`` to add its time to ``spent``; returns
    the one-element total of the outermost calls (one method calling another counts once)."""
    total, depth = [0.0], [0]
    for name in names:
        method = getattr(cls, name)

        def wrapper(self, *args, _method=method, _name=name, **kwargs):
            start = time.perf_counter()
            depth[0] += 1
            try:
                return _method(self, *args, **kwargs)
            finally:
                depth[0] -= 1
                seconds = time.perf_counter() - start
                spent[_name] += seconds
                calls[_name] += 1
                if not depth[0]:
                    total[0] += seconds
        setattr(cls, name, wrapper)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--link", default="loopback", help="link profile (edgespec link --help)")
    parser.add_argument("--prompts", type=int, default=6, help="held-out prompts, in order")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    from edgespec.cloud.bench.harness import Harness, load_prompts
    from edgespec.cloud.link.profiles import get_profile
    from edgespec.edge.planner import Planner

    spent, calls = Counter(), Counter()
    outermost = timed(Planner, METHODS, spent, calls)
    prompts = load_prompts(Path("prompts/heldout.jsonl"), args.prompts)
    common = dict(max_new_tokens=args.max_new_tokens, stop_token_ids=(), seed=0)
    with Harness(Path("models/demo/target"), Path("models/demo/draft"), progress=print) as harness:
        harness.warm_up(prompts[0])
        harness.use_link(get_profile(args.link))
        client = harness.new_client()
        try:
            client.generate(prompts[0], **(common | {"max_new_tokens": 16}))
            spent.clear()
            calls.clear()
            outermost[0] = 0.0
            wall_ms = rounds = 0.0
            for prompt in prompts:
                result = client.generate(prompt, **common)
                wall_ms += 1000 * result.stats.wall_s
                rounds += result.stats.rounds
        finally:
            client.close()
    total = 1000 * outermost[0]
    print(f"\n{args.link}, {len(prompts)} prompts, {args.max_new_tokens} tokens: {wall_ms:.0f} ms, {rounds:.0f} rounds")
    for name, seconds in spent.most_common():
        print(f"  {name:24s} {calls[name]:6d} calls {1000 * seconds:8.1f} ms ({1e6 * seconds / calls[name]:.0f} us each)")
    print(f"  planner: {total:.1f} ms, {total / max(rounds, 1):.2f} ms per round, {100 * total / wall_ms:.1f}% of the wall time")


if __name__ == "__main__":
    main()
