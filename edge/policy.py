"""How many tokens to draft per round: fixed, or adaptive from measured acceptance and cost.

A k policy has two methods, as in transformers' candidate generators: ``next_k(limit)`` before
a round and ``update(...)`` after its verdict.

The adaptive policy follows the seeds' rule (lengthen when acceptance is high, shorten when it
is low) by maximising the expected tokens per second of a round:

    E[tokens | k] = (1 - a^(k+1)) / (1 - a)          (accepted drafts + the recovered/bonus token)
    cost(k)       = round_ms(k) + k * draft_ms        (round trip + verification, drafting)

where a is the per-token acceptance probability. Estimates, all exponentially weighted so they
follow the text as it changes:

- a: each round is n successes and, if n < k, one failure (the maximum-likelihood estimate
  under independent per-token acceptance), started from a weak prior;
- draft_ms: measured drafting time per token;
- round_ms(k) = base + slope * k: the measured send -> verdict time, fitted on (k, time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edgespec.edge.params import parse_k


class KPolicy(Protocol):
    def next_k(self, limit: int) -> int: ...

    def update(self, k: int, accepted: int, *, draft_ms: float | None, wait_ms: float) -> None: ...


@dataclass
class FixedK:
    k: int

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")

    def next_k(self, limit: int) -> int:
        return max(1, min(self.k, limit))

    def update(self, k: int, accepted: int, *, draft_ms: float | None, wait_ms: float) -> None:
        pass


def expected_tokens(alpha: float, k: int) -> float:
    """Expected committed tokens of a round with k drafts (bonus included)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class AdaptiveK:
    """Picks k to maximise expected tokens per millisecond, from measured a and costs."""

    def __init__(
        self,
        *,
        k_min: int = 1,
        k_max: int = 16,
        decay: float = 0.9,
        prior_alpha: float = 0.7,
        prior_weight: float = 4.0,
        initial_draft_ms: float = 0.5,
        initial_round_ms: float = 10.0,
    ):
        if not 1 <= k_min <= k_max:
            raise ValueError(f"need 1 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.k_min, self.k_max, self.decay = k_min, k_max, decay
        self.successes = prior_alpha * prior_weight
        self.trials = prior_weight
        self.draft_ms = initial_draft_ms
        # Weighted sums for the least-squares fit of wait_ms = base + slope * k.
        self._w = self._wk = self._wkk = self._wt = self._wkt = 0.0
        self._initial_round_ms = initial_round_ms

    @property
    def alpha(self) -> float:
        # NOTE: clamped below 1 so the expected-tokens formula never divides by zero.
        return min(self.successes / self.trials, 0.999)

    def round_ms(self, k: int) -> float:
        if self._w < 1e-9:
            return self._initial_round_ms
        mean_k, mean_t = self._wk / self._w, self._wt / self._w
        var_k = self._wkk / self._w - mean_k**2
        slope = (self._wkt / self._w - mean_k * mean_t) / var_k if var_k > 1e-6 else 0.0
        slope = max(slope, 0.0)  # verification never gets cheaper with more drafts
        return max(mean_t + slope * (k - mean_k), 0.0)

    def next_k(self, limit: int) -> int:
        upper = max(self.k_min, min(self.k_max, limit))
        best_k, best_rate = self.k_min, -1.0
        for k in range(self.k_min, upper + 1):
            rate = expected_tokens(self.alpha, k) / (self.round_ms(k) + k * self.draft_ms)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return min(best_k, max(1, limit))

    def update(self, k: int, accepted: int, *, draft_ms: float | None, wait_ms: float) -> None:
        """Feeds one round's outcome; ``draft_ms`` None when it included a prompt prefill."""
        d = self.decay
        self.successes = d * self.successes + accepted
        self.trials = d * self.trials + accepted + (1 if accepted < k else 0)
        if draft_ms is not None:
            self.draft_ms = d * self.draft_ms + (1 - d) * (draft_ms / max(k, 1))
        self._w = d * self._w + 1.0
        self._wk = d * self._wk + k
        self._wkk = d * self._wkk + k * k
        self._wt = d * self._wt + wait_ms
        self._wkt = d * self._wkt + k * wait_ms


def make_policy(k: int | str, *, k_max: int = 16) -> KPolicy:
    """``k`` is a number (fixed) or "auto" (adaptive); ``params.parse_k`` reads it."""
    k = parse_k(k)
    return AdaptiveK(k_max=k_max) if k == "auto" else FixedK(int(k))
