"""Position-keyed draws (coupled mode), device side: the hash bit for bit (the values a port in
another language checks itself against), the draws' statistics, the draft's sampler, and the
seed an unseeded request draws from the OS. Numpy only, like the module."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from edgespec.edge.params import GenerationParams, Mode, SamplingParams, served_mode
from edgespec.edge.sampling import (
    PositionDraws,
    SparseDist,
    coupled_token,
    mix64,
    point_mass,
    position_exponentials,
    position_key,
    position_uniforms,
    round_rng,
    sample,
    truncate_top_n,
)

# ---- the hash, bit for bit (docs/protocol.md "Coupled sampling") -----------------------------

# splitmix64 seeded with 0 yields 0xE220A8397B1DCDAF first (the reference implementation).
SPLITMIX_FIRST_OUTPUTS = [(0, 0xE220A8397B1DCDAF), (0x9E3779B97F4A7C15, 0x6E789E6AA1B965F4)]
# (seed, position, token) -> the 64-bit hash, and u: pinned, so a change of the scheme (which
# changes every seeded text) cannot pass unnoticed, and a port has values to match.
GOLDEN = [  # (seed, position, token, key, hash, u)
    (0, 0, 0, 0xA706DD2F4D197E6F, 0x238275BC38FCBE91, 0.13870941014555427),
    (0, 0, 1, 0xA706DD2F4D197E6F, 0x2F32A78496C67C60, 0.18436667429957676),
    (1, 7, 2, 0x7716DA39CBA275B2, 0x69A51566829A579A, 0.412675225760361),
    (2**64 - 1, 123456, 49151, 0x119C098BCEFB8E27, 0x8D09B6D2A9EA0B39, 0.5509294761958828),
    (7, 1000, 262143, 0x5E2C964F7D55A4B6, 0x20A129FA1129EB99, 0.1274591670527695),
]


@pytest.mark.parametrize("state, first", SPLITMIX_FIRST_OUTPUTS)
def test_mix64_is_splitmix64(state, first):
    assert mix64(state) == first


def test_array_hash_equals_the_scalar_definition():
    for seed, position in [(0, 0), (1, 7), (2**63 + 5, 10**6), (2**64 - 1, 3)]:
        ids = np.array([0, 1, 2, 4095, 49151, 262143], dtype=np.int64)
        key = position_key(seed, position)
        assert key == mix64(mix64(seed) ^ position)
        expected = [max((mix64(key ^ int(v)) >> 11) * 2.0**-53, 2.0**-54) for v in ids]
        assert position_uniforms(seed, position, ids).tolist() == expected  # bit for bit
        np.testing.assert_array_equal(position_exponentials(seed, position, ids), -np.log(np.array(expected)))


@pytest.mark.parametrize("seed, position, token, key, hashed, u", GOLDEN)
def test_golden_values(seed, position, token, key, hashed, u):
    assert position_key(seed, position) == key
    assert mix64(key ^ token) == hashed
    assert hashed >> 11 == int(u * 2**53)
    assert position_uniforms(seed, position, np.array([token]))[0] == u


def test_uniforms_are_uniform_and_positions_independent():
    ids = np.arange(20000)
    a, b = position_uniforms(42, 100, ids), position_uniforms(42, 101, ids)
    assert ((a > 0) & (a < 1)).all()
    assert stats.kstest(a, "uniform").pvalue > 1e-4 and stats.kstest(b, "uniform").pvalue > 1e-4
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.05
    assert abs(np.corrcoef(a, position_uniforms(43, 100, ids))[0, 1]) < 0.05  # seeds too
    e = position_exponentials(42, 100, ids)
    assert stats.kstest(e, "expon").pvalue > 1e-4


def test_position_and_seed_must_be_valid():
    with pytest.raises(ValueError, match="position"):
        position_key(0, -1)
    with pytest.raises(ValueError, match="seed"):
        position_key(2**64, 0)


# ---- the draws --------------------------------------------------------------------------------

Q = SparseDist(token_ids=np.array([7, 3, 11, 0], dtype=np.int32), probs=np.array([0.5, 0.25, 0.15, 0.1]))


def test_position_draws_sample_exactly_the_sparse_q():
    draws = 20000
    counts = np.zeros(4)
    index = {int(t): i for i, t in enumerate(Q.token_ids)}
    for seed in range(draws):
        counts[index[sample(Q, PositionDraws(seed), 5)]] += 1
    assert stats.chisquare(counts, Q.probs * draws).pvalue > 1e-4


def test_the_same_position_gives_the_same_token_whatever_else():
    draws = PositionDraws(9)
    tokens = [sample(Q, draws, position) for position in range(40)]
    assert tokens == [sample(Q, PositionDraws(9), position) for position in range(40)]
    assert len(set(tokens)) > 1  # positions draw anew
    assert sample(point_mass(4), draws, None) == 4  # a point mass needs no position
    with pytest.raises(ValueError, match="position"):
        sample(Q, draws)


def test_round_generators_still_work():
    assert sample(Q, round_rng(1, 2)) == sample(Q, round_rng(1, 2))


@pytest.mark.parametrize("p", [[0.15, 0.06, 0.13, 0.55, 0.11], [0.0, 0.5, 0.0, 0.2, 0.3]])
def test_coupled_token_follows_p(p):
    p = np.array(p)
    draws = 20000
    counts = np.bincount([coupled_token(p, seed, 3) for seed in range(draws)], minlength=p.size)
    support = p > 0
    assert counts[~support].sum() == 0  # a token p rules out is never emitted
    assert stats.chisquare(counts[support], p[support] * draws).pvalue > 1e-4


def test_coupled_token_on_the_full_vocabulary_equals_the_race_on_the_support():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(50, 0.3))
    p[rng.choice(50, 20, replace=False)] = 0.0
    p /= p.sum()
    for seed in range(200):
        e = position_exponentials(seed, 11, np.arange(50))
        with np.errstate(divide="ignore"):
            assert coupled_token(p, seed, 11) == int(np.argmax(p / e))


def test_the_draft_agrees_with_the_target_as_the_coupling_allows():
    """P(argmax q/E == argmax p/E) is at least (1 - TV) / (1 + TV) (Gumbel coupling), below the
    1 - TV of min(p, q), and 1 when q = p."""
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = SparseDist(token_ids=np.arange(4, dtype=np.int32), probs=np.array([0.25, 0.25, 0.25, 0.25]))
    draws = 20000
    agree = np.mean([sample(q, PositionDraws(s), 2) == coupled_token(p, s, 2) for s in range(draws)])
    tv = 0.5 * np.abs(p - q.probs).sum()
    assert (1 - tv) / (1 + tv) - 0.02 < agree < 1 - tv + 0.02
    same = SparseDist(token_ids=np.arange(4, dtype=np.int32), probs=p)
    assert all(sample(same, PositionDraws(s), 2) == coupled_token(p, s, 2) for s in range(500))


def test_a_top_n_cut_q_is_still_an_exact_sample_of_itself():
    probs = np.array([0.05, 0.4, 0.3, 0.15, 0.1])
    cut = truncate_top_n(probs, 3)
    draws = 20000
    counts = np.zeros(5)
    for seed in range(draws):
        counts[sample(cut, PositionDraws(seed), 0)] += 1
    kept = cut.token_ids
    assert counts.sum() == counts[kept].sum()
    assert stats.chisquare(counts[kept], cut.probs * draws).pvalue > 1e-4


# ---- the seed ---------------------------------------------------------------------------------


def test_an_unseeded_sampled_request_draws_a_fresh_seed_from_the_os():
    seeds = {SamplingParams(temperature=0.8).seed for _ in range(3)}
    assert len(seeds) == 3 and all(0 <= s < 2**63 for s in seeds)
    generation = GenerationParams(temperature=0.8)
    assert generation.sampling.seed == generation.seed == generation.draft_sampling.seed  # one seed per request
    assert SamplingParams(temperature=0.8, seed=7).seed == 7 and SamplingParams(temperature=0.8, seed=0).seed == 0
    assert SamplingParams().seed == 0  # greedy draws nothing


def test_sampled_requests_default_to_coupled_mode():
    assert GenerationParams(temperature=0.8).mode is Mode.COUPLED
    assert GenerationParams().mode is Mode.GREEDY
    assert GenerationParams(temperature=0.8, mode="exact").mode is Mode.EXACT


def test_an_older_server_without_coupled_mode_gets_exact():
    params = GenerationParams(temperature=0.8)
    older = served_mode(params, ("greedy", "exact", "token"))
    assert older.mode is Mode.EXACT and older.seed == params.seed
    assert served_mode(params, ("greedy", "exact", "token", "coupled")) is params
    greedy = GenerationParams()
    assert served_mode(greedy, ("greedy",)) is greedy
    # A server that serves no sampled mode (the vLLM backend) refuses coupled by name at Open.
    assert served_mode(params, ("greedy",)) is params
