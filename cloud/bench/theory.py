"""The speedup arithmetic of the seeds' tuning method, in one place.

Symbols (as in the seed documents and Leviathan et al. 2023):

- a (alpha): probability that a drafted token is accepted, given the ones before it were;
- k: drafted tokens per round;
- c: how many draft tokens cost one target step, c = T_target / T_draft;
- tau: mean acceptance length, tokens committed per round (the bonus token included).

    E[tau](a, k)      = (1 - a^(k+1)) / (1 - a)
    speedup(a, k, c)  = (1 - a^(k+1)) / ((1 - a) (1 + k/c))

E[tau] at geometric acceptance is ``expected_tokens`` (the planner's own, ``edge/acceptance.py``,
generalises it to acceptance by position); the best k maximises tokens per unit of cost, as the
planner chooses (with cost(k) = 1 + k/c target steps for the seeds' curve).

The formula is the ideal: verifying k+1 tokens costs one target step and the network is free.
``cost_model_ms_per_token`` adds what the ideal leaves out (measured verification time at this
k and the round trip), so a measured speedup can be compared with both.
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_tokens(alpha: float, k: int) -> float:
    """Expected committed tokens of a round of k drafts at geometric acceptance ``alpha``."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def seeds_speedup(alpha: float, k: int, c: float) -> float:
    """The seeds' speedup curve (1 - a^(k+1)) / ((1 - a)(1 + k/c))."""
    return expected_tokens(alpha, k) / (1.0 + k / c)


def alpha_from_rounds(rounds: list[tuple[int, int]]) -> float:
    """Maximum-likelihood per-token acceptance from (k, accepted) pairs.

    A round with n accepted out of k is n successes and, if n < k, one failure: the
    positions after the first rejection were never tested.
    """
    successes = sum(n for _, n in rounds)
    failures = sum(1 for k, n in rounds if n < k)
    total = successes + failures
    return successes / total if total else 0.0


def alpha_from_tau(tau: float, k: int, tolerance: float = 1e-9) -> float:
    """The a for which E[tau](a, k) equals a measured tau (bisection; tau in [1, k+1])."""
    tau = min(max(tau, 1.0), k + 1.0)
    low, high = 0.0, 1.0
    while high - low > tolerance:
        mid = (low + high) / 2
        if expected_tokens(mid, k) < tau:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass(frozen=True)
class RoundCosts:
    """Measured costs of a speculative round, in milliseconds."""

    draft_ms_per_token: float
    wait_ms: float  # send -> verdict: network round trip + verification at this k
    target_ms_per_token: float  # cloud-only generation, per token, on the same path


def cost_model_ms_per_token(tau: float, k: int, costs: RoundCosts) -> float:
    """ms per generated token predicted from tau and the measured round costs."""
    return (k * costs.draft_ms_per_token + costs.wait_ms) / tau


def predicted_speedups(tau: float, k: int, costs: RoundCosts) -> dict[str, float]:
    """The two predictions a measured speedup is compared with."""
    c = costs.target_ms_per_token / costs.draft_ms_per_token if costs.draft_ms_per_token > 0 else float("inf")
    return {
        "c": c,
        "ideal": tau / (1.0 + k / c),
        "cost_model": costs.target_ms_per_token / cost_model_ms_per_token(tau, k, costs),
    }
