"""k policies: fixed, and adaptive from measured acceptance and cost."""

from __future__ import annotations

import pytest

from edgespec.edge.policy import AdaptiveK, FixedK, expected_tokens, make_policy


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_fixed_k_respects_limit():
    assert FixedK(5).next_k(3) == 3 and FixedK(5).next_k(10) == 5
    with pytest.raises(ValueError):
        FixedK(0)


def train(policy: AdaptiveK, alpha_pattern, rounds=60, k=4):
    for i in range(rounds):
        accepted = alpha_pattern(i, k)
        policy.update(k, accepted, draft_ms=0.5 * k, wait_ms=10.0 + 0.5 * k)


def test_adaptive_k_lengthens_when_acceptance_is_high_and_shortens_when_low():
    high, low = AdaptiveK(), AdaptiveK()
    train(high, lambda i, k: k if i % 10 else k - 1)  # ~97% per-token acceptance
    train(low, lambda i, k: 0 if i % 2 else 1)  # ~33%
    assert high.alpha > 0.9 and low.alpha < 0.4
    assert high.next_k(16) > 6
    assert low.next_k(16) <= 2


def test_adaptive_k_draft_cost_matters():
    cheap, costly = AdaptiveK(initial_draft_ms=0.1), AdaptiveK(initial_draft_ms=20.0)
    assert cheap.next_k(16) > costly.next_k(16)


def test_make_policy():
    assert isinstance(make_policy("auto"), AdaptiveK)
    assert make_policy("3").next_k(8) == 3
    with pytest.raises(ValueError):
        make_policy("many")


def test_adaptive_k_can_choose_by_the_planners_acceptance_by_position():
    """Bursty text: the first draft of a block is often wrong, the later ones seldom; a policy
    told the expected tokens by position (``Planner.expected_tokens``) reaches a longer k than
    the geometric formula at the same mean acceptance."""
    def by_position(k: int) -> float:  # c_1 = 0.6, then 0.95 a position
        return 1.0 + sum(0.6 * 0.95 ** (i - 1) for i in range(1, k + 1))

    geometric = AdaptiveK(prior_alpha=0.7, initial_draft_ms=0.5, initial_round_ms=20.0)
    told = AdaptiveK(prior_alpha=0.7, initial_draft_ms=0.5, initial_round_ms=20.0, tokens=by_position)
    assert told.next_k(16) > geometric.next_k(16)
