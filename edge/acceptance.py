"""How likely a draft is to be worth speculating with: a Beta posterior on per-position acceptance.

Each verified round with k drafts of which n were accepted is n successes and, if n < k, one
failure (positions after the first rejection are not observed), as in ``policy.AdaptiveK``. With
Jeffreys' prior Beta(1/2, 1/2) the acceptance a has the posterior

    a | rounds ~ Beta(1/2 + sum n, 1/2 + number of rounds with n < k)

Jeffreys' prior is U-shaped: a draft is usually either a model of the target (a ~ 0.6-0.9) or
not one at all (a near 0, e.g. a pretrained model's first layers), rarely in between. Speculation
can only win if a reaches the break-even acceptance a* of the link (``break_even``), so the
posterior chance that it can win is P(a >= a* | rounds), the Beta's upper tail at a*.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from edgespec.edge.policy import expected_tokens

PRIOR = 0.5  # Jeffreys' prior: Beta(1/2, 1/2)
ROUNDS = 16  # recent rounds (verified, or replayed over a stream) the posterior is computed over


@dataclass
class Acceptance:
    """The last ``ROUNDS`` rounds as (accepted drafts, rejections)."""

    rounds: deque = field(default_factory=lambda: deque(maxlen=ROUNDS))

    def add(self, accepted: int, k: int) -> None:
        self.rounds.append((accepted, 1 if accepted < k else 0))

    @property
    def posterior(self) -> tuple[float, float]:
        """The Beta posterior's (alpha, beta) parameters."""
        return PRIOR + sum(n for n, _ in self.rounds), PRIOR + sum(f for _, f in self.rounds)

    def chance_at_least(self, a: float) -> float:
        """P(acceptance >= a) under the posterior."""
        return beta_upper_tail(a, *self.posterior)

    def __len__(self) -> int:
        return len(self.rounds)


def break_even(tau_needed: float, max_k: int) -> float:
    """The per-position acceptance at which a round of ``max_k`` drafts commits ``tau_needed``
    tokens on average: 0 if one token a round is enough, 1 if not even max_k + 1 are."""
    if tau_needed <= 1.0:
        return 0.0
    if tau_needed >= max_k + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(40):  # expected_tokens increases with a: bisect to ~1e-12
        mid = 0.5 * (low + high)
        low, high = (mid, high) if expected_tokens(mid, max_k) < tau_needed else (low, mid)
    return high


def beta_upper_tail(x: float, a: float, b: float) -> float:
    """P(X >= x) for X ~ Beta(a, b): 1 - I_x(a, b), the regularised incomplete beta function by
    its continued fraction (Numerical Recipes 6.4); the edge has no scipy."""
    if x <= 0.0:
        return 1.0
    if x >= 1.0:
        return 0.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    # NOTE: the continued fraction converges fast only below the mean; above it, use the symmetry
    # I_x(a, b) = 1 - I_{1-x}(b, a).
    if x < (a + 1.0) / (a + b + 2.0):
        return 1.0 - math.exp(log_front) * _continued_fraction(x, a, b) / a
    return math.exp(log_front) * _continued_fraction(1.0 - x, b, a) / b


def _continued_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300  # NOTE: keeps Lentz's method from dividing by zero
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return result
