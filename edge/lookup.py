"""Context lookup: propose the token that followed the last occurrence of the current suffix.

A one-layer draft cannot copy: copying a span seen earlier takes an induction circuit, two
attention layers deep. Source code repeats itself (names, call patterns, whole lines), and the
target copies those spans readily, so a greedy draft that looks the suffix up in its own
context wins back exactly the positions the small model loses. This is prompt lookup decoding
(an n-gram speculator) used position by position inside the draft model's block: where the
last ``n`` tokens (longest first, ``max_n`` down to ``min_n``) occurred before, the token that
followed them is drafted; elsewhere the model's own argmax is.

Greedy only: the verifier's greedy rule accepts any proposal equal to the target's argmax, so
the output is the target's whatever the draft proposes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LookupConfig:
    """``max_n``/``min_n``: the suffix lengths tried, longest first; ``window``: how far back to look."""

    max_n: int = 4
    min_n: int = 2
    window: int = 1024

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"lookup needs 1 <= min_n <= max_n, got min_n={self.min_n} max_n={self.max_n}")
        if self.window < self.max_n + 1:
            raise ValueError(f"lookup window must be > max_n, got window={self.window} max_n={self.max_n}")


def lookup_next(tokens: Sequence[int], config: LookupConfig) -> int | None:
    """The token after the most recent earlier occurrence of the longest matching suffix, or None."""
    end = len(tokens)
    start = max(0, end - config.window)
    for n in range(min(config.max_n, end - 1), config.min_n - 1, -1):
        suffix = list(tokens[end - n :])
        first = suffix[0]
        # scan right to left: the most recent occurrence wins (code repeats locally)
        for i in range(end - n - 1, start - 1, -1):
            if tokens[i] == first and list(tokens[i : i + n]) == suffix:
                return int(tokens[i + n])
    return None
