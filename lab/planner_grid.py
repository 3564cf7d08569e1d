"""The planner against scripted texts and links: k=auto over the faster of cloud-only and
always speculating, per link and per shape of text, with no wall clock (the scripted world of
``edgespec.cloud.simulate.planner``; the same command prints the same figures).

    .venv/bin/python lab/planner_grid.py [--seeds 8] [--requests 4]

The world is shaped like the demo pair on 2 CPU cores: a stream of 8.5 ms/token (decoding step
7.5 + 1 per message), a verify forward of 8 ms + 0.3 per draft, 2.5 ms of the device's own time
per round and 0.3 ms of drafting per token. A text of 128 tokens is easy (the draft right with
chance ``good``) but for a hard passage (``bad``) over tokens [lo, hi); in "texts differ" each
request is another text, of its own acceptance. Each cell: k=auto over
the faster path (>= 0.95 is the goal), always speculating over cloud-only, and k=auto's switches.
"""

from __future__ import annotations

import argparse
import sys

from edgespec.cloud.simulate.planner import World, bernoulli_hits, compare, rtt_phases

LINKS = {"loopback": 0.3, "lan": 1.7, "wifi": 15.0, "5g": 33.0, "4g": 61.0}  # round trip, ms
# the demo pair on 2 CPU cores (the module docstring); lab/planner_traces.py prices in it too
WORLD = dict(forward_ms=8.0, forward_per_draft_ms=0.3, decode_ms=7.5, message_ms=1.0, device_ms=2.5, draft_ms=0.3)
TEXTS = {  # name: (lo, hi, good, bad)
    "hard 0-24": (0, 24, 0.94, 0.5),  # a hard start, an easy rest
    "hard 20-60": (20, 60, 0.92, 0.3),
    "hard 30-50": (30, 50, 0.92, 0.2),
    "mixed 40-90": (40, 90, 0.9, 0.45),
    "easy": (0, 0, 0.9, 0.9),
    "fair": (0, 128, 0.6, 0.6),
    "texts differ": None,  # each request another text: TEXT_ACCEPTANCE, rotated by the seed
}
# Per-text acceptance for "texts differ": held-out texts on the demo pair committed 3.7-14.2
# tokens a round, so one request's acceptance says little of the next one's.
TEXT_ACCEPTANCE = (0.95, 0.5, 0.85, 0.4, 0.92, 0.6, 0.75, 0.3)


def acceptance_at(text: tuple[int, int, float, float] | None, seed: int):
    """The draft's chance to be right at a position (128 tokens a request)."""
    if text is None:
        return lambda p: TEXT_ACCEPTANCE[(seed + p // 128) % len(TEXT_ACCEPTANCE)]
    lo, hi, good, bad = text
    return lambda p: bad if lo <= p % 128 < hi else good


def cell(rtt: float, text: tuple[int, int, float, float] | None, seeds: int, requests: int) -> tuple[float, float, int]:
    t = compare((World(rtt_ms=rtt_phases((0, rtt)), hits=bernoulli_hits(acceptance_at(text, seed), seed), **WORLD)
                 for seed in range(seeds)), requests)
    return min(t.cloud, t.spec) / t.auto, t.cloud / t.spec, t.switches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="texts drawn per cell")
    parser.add_argument("--requests", type=int, default=4, help="requests per device (one planner across them)")
    args = parser.parse_args()
    print("k=auto / faster (always speculating / cloud-only speed, k=auto's switches)")
    print(f"{'':10s}" + "".join(f"{name:>26s}" for name in TEXTS))
    ratios = []
    for link, rtt in LINKS.items():
        cells = [cell(rtt, text, args.seeds, args.requests) for text in TEXTS.values()]
        ratios += [ratio for ratio, _, _ in cells]
        print(f"{link:10s}" + "".join(f"{f'{r:.3f} ({s:.2f}x, {n} sw)':>26s}" for r, s, n in cells))
    print(f"mean {sum(ratios) / len(ratios):.3f}, worst {min(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
