"""Context lookup in the sampling modes: the q it drafts from, and that drafting from it and
verifying with the accept rule emits tokens that follow p exactly.

The accept rule is written out here as a slow reference in closed form (numpy, no torch):
P(emit y) = q(y) min(1, p(y)/q(y)) + (1 - sum_x q(x) min(1, p(x)/q(x))) norm(max(0, p - q))(y).
The fast batched rule on the server is checked against p statistically in
tests/cloud/serving/test_accept.py, and end to end by tests/e2e/test_sampling_fit.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgespec.edge.lookup import LookupConfig, lookup_next
from edgespec.edge.params import SamplingParams
from edgespec.edge.sampling import SparseDist, mix_point_mass, point_mass, probs_from_logits, round_rng, sample, truncate_top_n

VOCAB = 5
P = np.array([0.40, 0.25, 0.15, 0.15, 0.05])
Q_MODEL = np.array([0.10, 0.10, 0.60, 0.10, 0.10])


def dense(dist: SparseDist, vocab: int = VOCAB) -> np.ndarray:
    out = np.zeros(vocab)
    out[dist.token_ids] = dist.probs
    return out


def emitted(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The exact distribution of the token one position emits: the draft x ~ q, then the rule."""
    accept = np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), 0.0)  # P(accept | x)
    accepted = q * accept
    residual = np.maximum(0.0, p - q)
    rejected = 1.0 - accepted.sum()
    recovered = residual / residual.sum() if residual.sum() > 0 else p
    return accepted + rejected * recovered


def emitted_token_only(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Token-only mode: x ~ q on the device; the server takes q as a point mass on x."""
    return sum(q[x] * emitted(p, np.eye(len(p))[x]) for x in range(len(p)) if q[x] > 0)


@pytest.mark.parametrize("token", range(VOCAB))
@pytest.mark.parametrize("weight", [1.0, 0.9, 0.5, 0.1, 0.0])
def test_lookup_q_emits_p_exactly(token, weight):
    q = dense(mix_point_mass(truncate_top_n(Q_MODEL, 0), token, weight))
    np.testing.assert_allclose(emitted(P, q), P, atol=1e-12)
    np.testing.assert_allclose(emitted_token_only(P, q), P, atol=1e-12)


def test_a_point_mass_accepts_with_p_of_x_and_recovers_p_without_x():
    for x in range(VOCAB):
        q = dense(point_mass(x))
        assert (q * np.minimum(1, P / np.where(q > 0, q, 1))).sum() == pytest.approx(P[x])  # acceptance
        without = P.copy()
        without[x] = 0
        np.testing.assert_allclose(np.maximum(0, P - q) / np.maximum(0, P - q).sum(), without / without.sum())


def test_a_point_mass_on_a_token_p_rules_out_always_recovers():
    p = np.array([0.5, 0.5, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(emitted(p, dense(point_mass(3))), p, atol=1e-12)


def test_a_point_mass_on_a_certain_token_is_always_accepted():
    p = np.eye(VOCAB)[2]
    q = dense(point_mass(2))
    assert (q * np.minimum(1, p / np.where(q > 0, q, 1))).sum() == 1.0


@pytest.mark.parametrize("top_n", [1, 2, 3, 5])
def test_the_mixture_keeps_within_top_n_and_holds_the_lookup_token(top_n):
    model = truncate_top_n(Q_MODEL, top_n)
    for token, weight in itertools.product(range(VOCAB), (0.3, 0.7)):
        mixed = mix_point_mass(model, token, weight, top_n)
        assert mixed.token_ids.size <= top_n
        assert mixed.probs.sum() == pytest.approx(1.0, abs=1e-12)
        assert mixed.prob_of(token) >= weight
        assert list(mixed.probs) == sorted(mixed.probs, reverse=True)
        np.testing.assert_allclose(emitted(P, dense(mixed)), P, atol=1e-12)  # whatever was cut


def test_mixture_weights_are_validated():
    with pytest.raises(ValueError, match="weight"):
        mix_point_mass(truncate_top_n(Q_MODEL, 0), 1, 1.5)


def test_sampling_a_point_mass_draws_its_token_and_one_uniform():
    a, b = round_rng(3, 7), round_rng(3, 7)
    assert sample(point_mass(4), a) == 4
    b.random()
    assert a.random() == b.random()  # the same stream a model draft would have left


# ---- a whole round: a draft chain whose second q depends on the first draft --------------


def context_lookup_q(context: list[int], logits: np.ndarray, params: SamplingParams, weight: float, top_n: int) -> np.ndarray:
    """The device's q at one position, as DraftModel.propose builds it."""
    model = truncate_top_n(probs_from_logits(logits, params), top_n)
    found = lookup_next(context, LookupConfig(max_n=2, min_n=1))
    return dense(model if found is None else mix_point_mass(model, found, weight, top_n))


def p_after(context: list[int]) -> np.ndarray:
    """A context-dependent synthetic target: which token came last shifts the distribution."""
    return np.roll(P, context[-1])


@pytest.mark.parametrize("weight", [1.0, 0.6])
@pytest.mark.parametrize("draft_temperature", [0.5, 1.0, 2.0])
def test_a_two_draft_round_with_lookup_emits_the_targets_joint(weight, draft_temperature):
    """Enumerates every path of a k=2 round: d1 ~ q1, accept or recover; d2 ~ q2(. | d1),
    accept or recover. The first two emitted tokens must follow p(y1) p(y2 | y1) exactly,
    whatever the draft temperature and the lookup weight (the draft's logits are its own)."""
    context = [1, 3, 1]  # lookup proposes 3 after 1; after a drafted 3, proposes 1
    params = SamplingParams(temperature=draft_temperature)
    logits = np.log(Q_MODEL)
    joint = np.zeros((VOCAB, VOCAB))
    p1 = p_after(context)
    q1 = context_lookup_q(context, logits, params, weight, top_n=3)
    for d1 in np.flatnonzero(q1):
        accept1 = min(1.0, p1[d1] / q1[d1])
        # accepted d1: position 2 drafts after it, with its own lookup
        p2 = p_after(context + [int(d1)])
        q2 = context_lookup_q(context + [int(d1)], logits, params, weight, top_n=3)
        joint[d1] += q1[d1] * accept1 * emitted(p2, q2)
    residual = np.maximum(0.0, p1 - q1)
    rejected = 1.0 - sum(q1[d] * min(1.0, p1[d] / q1[d]) for d in np.flatnonzero(q1))
    for y1 in range(VOCAB):
        # recovered y1 ends the round; the next round emits from p(. | y1) (the one-position fact above)
        joint[y1] += rejected * residual[y1] / residual.sum() * p_after(context + [y1])
    expected = p1[:, None] * np.stack([p_after(context + [y]) for y in range(VOCAB)])
    np.testing.assert_allclose(joint, expected, atol=1e-12)


def test_the_reference_can_fail():
    """The same enumeration rejects a rule that accepts every draft: it emits q, not p."""
    q = dense(point_mass(2))
    assert not np.allclose(q, P)  # (accept-all emits q)
    assert np.allclose(emitted(P, q), P)
