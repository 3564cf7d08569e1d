"""Draft-side sampling: hand cases with one right answer, then the sampler's statistics."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from edgespec.edge.params import SamplingParams
from edgespec.edge.sampling import SparseDist, probs_from_logits, round_rng, sample, truncate_top_n


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


LOGITS = np.array([2.0, 1.0, 0.5, -1.0, 3.0])


def test_greedy_is_a_point_mass_on_the_argmax():
    params = SamplingParams()
    assert params.is_greedy and not SamplingParams(temperature=0.7).is_greedy
    np.testing.assert_array_equal(probs_from_logits(LOGITS, params), [0, 0, 0, 0, 1])


def test_temperature_scales_logits():
    for temperature in (0.5, 1.0, 2.0):
        got = probs_from_logits(LOGITS, SamplingParams(temperature=temperature))
        np.testing.assert_allclose(got, softmax(LOGITS / temperature), rtol=1e-12)
        assert got.dtype == np.float64 and got.sum() == pytest.approx(1.0)


def test_top_k_keeps_exactly_k_even_with_ties():
    got = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(got, np.array([np.e**2, 0, 0, 0, np.e**3]) / (np.e**2 + np.e**3))
    tied = probs_from_logits(np.zeros(6), SamplingParams(temperature=1.0, top_k=3))
    assert np.count_nonzero(tied) == 3 and tied.sum() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    cases = {0.5: [1, 0, 0, 0], 0.51: [0.5, 0.3, 0, 0], 0.8: [0.5, 0.3, 0, 0], 0.81: [0.5, 0.3, 0.15, 0], 1.0: [0.5, 0.3, 0.15, 0.05]}
    for top_p, kept in cases.items():
        got = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=top_p))
        np.testing.assert_allclose(got, np.array(kept) / sum(kept), rtol=1e-9, err_msg=f"top_p={top_p}")
    # A tiny top_p still keeps the single most likely token.
    np.testing.assert_array_equal(probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=1e-9)), [1, 0, 0, 0])


def test_top_k_applies_before_top_p():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    # top_k=2 renormalises to [4/7, 3/7]; top_p=0.5 then keeps only the first.
    got = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5))
    np.testing.assert_array_equal(got, [1, 0, 0, 0])


def test_large_logits_are_stable():
    got = probs_from_logits(np.array([1e4, 1e4 - 1.0, -1e4]), SamplingParams(temperature=1.0))
    np.testing.assert_allclose(got, [1 / (1 + np.exp(-1)), np.exp(-1) / (1 + np.exp(-1)), 0.0], atol=1e-12)
    with pytest.raises(ValueError, match="NaN"):
        probs_from_logits(np.array([0.0, np.nan]), SamplingParams(temperature=1.0))


def test_truncate_top_n_renormalises_and_orders_by_probability():
    probs = np.array([0.1, 0.4, 0.0, 0.2, 0.3])
    dist = truncate_top_n(probs, 2)
    assert dist.token_ids.dtype == np.int32 and dist.probs.dtype == np.float64
    np.testing.assert_array_equal(dist.token_ids, [1, 4])
    np.testing.assert_allclose(dist.probs, [4 / 7, 3 / 7])
    for n in (0, -1, 10):
        full = truncate_top_n(probs, n)
        np.testing.assert_array_equal(full.token_ids, [1, 4, 3, 0])  # the zero entry is dropped
        assert full.probs.sum() == pytest.approx(1.0, abs=1e-15)
    assert full.prob_of(3) == pytest.approx(0.2) and full.prob_of(2) == 0.0


def test_round_rng_is_deterministic_per_seed_and_round():
    draws = lambda seed, rnd: round_rng(seed, rnd).random(4)  # noqa: E731
    np.testing.assert_array_equal(draws(7, 3), draws(7, 3))
    assert not np.array_equal(draws(7, 3), draws(7, 4))
    assert not np.array_equal(draws(7, 3), draws(8, 3))


def test_sample_is_seeded_and_never_draws_zero_probability_tokens():
    dist = SparseDist(np.array([5, 9, 2], np.int32), np.array([0.5, 0.0, 0.5]))
    first = [sample(dist, round_rng(1, r)) for r in range(200)]
    assert first == [sample(dist, round_rng(1, r)) for r in range(200)]
    assert set(first) == {5, 2}


def test_sample_follows_the_distribution():
    """Chi-square goodness of fit on a 5-token distribution."""
    dist = truncate_top_n(np.array([0.05, 0.1, 0.15, 0.3, 0.4, 0.0, 0.0]), 0)
    rng = round_rng(1234, 0)
    draws = np.array([sample(dist, rng) for _ in range(20_000)])
    observed = np.array([(draws == t).sum() for t in dist.token_ids])
    assert observed.sum() == draws.size  # nothing outside the support
    result = stats.chisquare(observed, dist.probs * draws.size)
    assert result.pvalue > 1e-3, (observed, result)
