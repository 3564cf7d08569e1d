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
from typing import Callable, Protocol

from edgespec.edge.params import parse_k


class KPolicy(Protocol):
    def next_k(self, limit: int) -> int: ...

    def update(self, k: int, accepted: int, *, draft_ms: float | None, wait_ms: float | None) -> None: ...


@dataclass
class FixedK:
    k: int

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")

    def next_k(self, limit: int) -> int:
        return max(1, min(self.k, limit))

    def update(self, k: int, accepted: int, *, draft_ms: float | None, wait_ms: float | None) -> None:
        pass


def expected_tokens(alpha: float, k: int) -> float:
    """Expected committed tokens of a round with k drafts (bonus included)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_k(tokens: Callable[[int], float], cost_ms: Callable[[int], float], k_min: int, k_max: int) -> int:
    """The k in [k_min, k_max] that commits the most tokens per millisecond: ``tokens(k)`` a
    round's expected tokens, ``cost_ms(k)`` its time. The adaptive policy and the planner's
    forecast both choose with it, so the planner predicts the k the policy will reach."""
    best, best_rate = k_min, -1.0
    for k in range(k_min, max(k_min, k_max) + 1):
        rate = tokens(k) / max(cost_ms(k), 1e-6)
        if rate > best_rate:
            best, best_rate = k, rate
    return best


@dataclass
class LinearFit:
    """An exponentially weighted least-squares line y = base + slope * x (slope >= 0: more
    drafts never cost less), for a cost against k."""

    decay: float = 0.9
    _w: float = 0.0
    _wx: float = 0.0
    _wxx: float = 0.0
    _wy: float = 0.0
    _wxy: float = 0.0

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self._w, self._wx, self._wxx = d * self._w + 1.0, d * self._wx + x, d * self._wxx + x * x
        self._wy, self._wxy = d * self._wy + y, d * self._wxy + x * y

    @property
    def empty(self) -> bool:
        return self._w < 1e-9

    @property
    def mean_x(self) -> float:
        """The x the line's samples weigh around (a sample there moves its level, not its slope)."""
        return self._wx / self._w if not self.empty else 0.0

    def at(self, x: float, default: float) -> float:
        return on_line(self.line(), x, default)

    def line(self) -> tuple[float, float, float] | None:
        """(mean x, mean y, slope >= 0) of the fitted line, for ``on_line``; None while empty."""
        if self.empty:
            return None
        mean_x, mean_y = self._wx / self._w, self._wy / self._w
        var_x = self._wxx / self._w - mean_x**2
        slope = (self._wxy / self._w - mean_x * mean_y) / var_x if var_x > 1e-6 else 0.0
        return mean_x, mean_y, max(slope, 0.0)


def on_line(line: tuple[float, float, float] | None, x: float, default: float) -> float:
    """A ``LinearFit.line`` at ``x`` (never below 0); ``default`` while it has none."""
    if line is None:
        return default
    mean_x, mean_y, slope = line
    return max(mean_y + slope * (x - mean_x), 0.0)


class AdaptiveK:
    """Picks k to maximise expected tokens per millisecond, from measured a and costs."""

    INITIAL_DRAFT_MS = 0.5  # a draft's price before any is measured (``make_policy``'s draft_ms)

    def __init__(
        self,
        *,
        k_min: int = 1,
        k_max: int = 16,
        decay: float = 0.9,
        prior_alpha: float = 0.7,
        prior_weight: float = 4.0,
        initial_draft_ms: float = INITIAL_DRAFT_MS,
        initial_round_ms: float = 10.0,
        tokens: Callable[[int], float] | None = None,
        round_prior: Callable[[int], float | None] | None = None,
    ):
        """``tokens``: a round's expected tokens at k from elsewhere (the planner's acceptance by
        position, ``Planner.expected_tokens``), so that the policy reaches the k the planner
        predicts; None: the geometric formula at this policy's own alpha. ``round_prior``: a
        round's wait at k until this policy has measured one (the planner's round trip and
        verify forward, which outlive a request, ``Forecast.wait_ms``; None while it knows
        neither), else ``initial_round_ms``."""
        if not 1 <= k_min <= k_max:
            raise ValueError(f"need 1 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.k_min, self.k_max, self.decay = k_min, k_max, decay
        self.successes = prior_alpha * prior_weight
        self.trials = prior_weight
        self.draft_ms = initial_draft_ms
        self.wait = LinearFit(decay)  # wait_ms = base + slope * k
        self._initial_round_ms = initial_round_ms
        self.tokens = tokens
        self.round_prior = round_prior

    @property
    def alpha(self) -> float:
        # NOTE: clamped below 1 so the expected-tokens formula never divides by zero.
        return min(self.successes / self.trials, 0.999)

    def round_ms(self, k: int) -> float:
        """A round's wait (send -> verdict) at k: the line fitted on this request's waits, else
        the prior's (``round_prior``), else ``initial_round_ms``."""
        line = self.wait.line()
        if line is None:
            prior = self.round_prior(k) if self.round_prior is not None else None
            return self._initial_round_ms if prior is None else prior
        return on_line(line, k, self._initial_round_ms)

    def next_k(self, limit: int) -> int:
        upper = max(self.k_min, min(self.k_max, limit))
        tokens = self.tokens or (lambda k: expected_tokens(self.alpha, k))
        k = best_k(tokens, lambda k: self.round_ms(k) + k * self.draft_ms, self.k_min, upper)
        return min(k, max(1, limit))

    def update(self, k: int, accepted: int, *, draft_ms: float | None, wait_ms: float | None) -> None:
        """Feeds one round's outcome; ``draft_ms`` None when it included a prompt prefill,
        ``wait_ms`` None for a block sent ahead (its wait, behind its predecessor's verdict, is
        no round trip: fitted, such waits made short blocks look cheap where they hold more
        often, and k fell from 15 to 10 on 4G)."""
        d = self.decay
        self.successes = d * self.successes + accepted
        self.trials = d * self.trials + accepted + (1 if accepted < k else 0)
        if draft_ms is not None:
            self.draft_ms = d * self.draft_ms + (1 - d) * (draft_ms / max(k, 1))
        if wait_ms is not None:
            self.wait.add(k, wait_ms)


def make_policy(k: int | str, *, k_max: int = 16, tokens: Callable[[int], float] | None = None,
                round_prior: Callable[[int], float | None] | None = None, draft_ms: float | None = None) -> KPolicy:
    """``k`` is a number (fixed) or "auto" (adaptive); ``params.parse_k`` reads it. ``tokens``
    and ``round_prior``: adaptive k's expected tokens per round and prior wait at k; ``draft_ms``:
    its first price of a draft, measured on earlier requests (None: ``AdaptiveK``'s default)."""
    k = parse_k(k)
    if k != "auto":
        return FixedK(int(k))
    first = draft_ms if draft_ms is not None and draft_ms > 0 else AdaptiveK.INITIAL_DRAFT_MS
    return AdaptiveK(k_max=k_max, tokens=tokens, round_prior=round_prior, initial_draft_ms=first)
