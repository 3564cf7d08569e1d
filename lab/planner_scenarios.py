"""The planner on texts shaped like the bench's misses, scripted: a hard text after easy ones, a
hard start with an easy rest, a hard passage mid-text (lab/README.md).

    .venv/bin/python lab/planner_scenarios.py [--seeds 8]

Each device's planner serves three easy texts (the draft right with the row's rest's chance)
and then the text of the row; the figure is cloud-only's time over k=auto's for that fourth
text, summed over the seeds (above 1: k=auto is faster). The world is
``edgespec.cloud.simulate.planner``'s: a round trip of 15, 33 or 61 ms, a forward of 6 ms + 0.5 a
draft, a decoding step of 8 ms; no wall clock, so the same command prints the same figures.
(``compare`` there sums every request of a device; this prices the fourth alone.)
"""

from __future__ import annotations

import argparse
import sys

from edgespec.cloud.simulate.planner import Sim, World, bernoulli_hits, cloud_only_ms, rtt_phases

LINKS = {"wifi": 15.0, "5g": 33.0, "4g": 61.0}  # round trip, ms
EASY, TEXT = 0.92, 128
# name: (first, last position of the hard passage within the text, its acceptance, the rest's and
# the texts' before)
SHAPES = {
    "hard 0.5 after easy": (0, TEXT, 0.5, EASY),
    "hard 0.6 after easy": (0, TEXT, 0.6, EASY),
    "hard 0.7 after easy": (0, TEXT, 0.7, EASY),
    "hard start 0-24": (0, 24, 0.5, 0.94),
    "hard passage 40-72": (40, 72, 0.5, 0.94),
}


def ratio(rtt: float, shape: tuple[int, int, float, float], seeds: int) -> float:
    lo, hi, bad, good = shape
    start = 3 * TEXT  # the fourth text
    auto = cloud = 0.0
    for seed in range(seeds):
        def rate(p: int) -> float:
            return bad if start + lo <= p < start + hi else good
        world = World(rtt_ms=rtt_phases((0, rtt)), hits=bernoulli_hits(rate, seed), forward_ms=6.0,
                      forward_per_draft_ms=0.5, decode_ms=8.0)
        sim = Sim(world)
        auto += [sim.generate(TEXT) for _ in range(4)][3].ms
        cloud += cloud_only_ms(world, TEXT, start)
    return cloud / auto


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="texts drawn per cell")
    args = parser.parse_args()
    print("cloud-only's time over k=auto's, the fourth text")
    print(f"{'':22s}" + "".join(f"{link:>8s}" for link in LINKS))
    for name, shape in SHAPES.items():
        print(f"{name:22s}" + "".join(f"{ratio(rtt, shape, args.seeds):8.3f}" for rtt in LINKS.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
