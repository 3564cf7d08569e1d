"""The coupled accept rule (``verify_coupled``): hand-built cases, the output distribution against
p, and the property the mode exists for: with one seed the output is the same whatever the round
boundaries (any k, a different k every round, k = 0 i.e. cloud-only, a resume), because every
emitted token is the target's own position-keyed sample t_P. Then the batch adapter."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from edgespec.cloud.serving.accept import Row, accept_rows, target_probs, verify_coupled
from edgespec.cloud.serving.codec import generate_from_proto
from edgespec.edge.params import Mode, SamplingParams
from edgespec.edge.sampling import PositionDraws, SparseDist, coupled_token, probs_from_logits, sample, truncate_top_n
from edgespec.v1 import speculative_pb2 as pb

torch.set_num_threads(1)

VOCAB = 5


def point_masses(tokens: list[int], vocab: int = VOCAB) -> np.ndarray:
    p = np.zeros((len(tokens), vocab))
    p[np.arange(len(tokens)), tokens] = 1.0
    return p


# ---- 1. hand-built cases ------------------------------------------------------------------------


def test_accepts_the_matching_prefix_and_emits_the_target_token_at_the_mismatch():
    p = point_masses([1, 2, 3, 4])  # the target's token is certain at every position
    assert verify_coupled([1, 2, 0], p, seed=5, position=10) == (2, 3)
    assert verify_coupled([1, 2, 3], p, seed=5, position=10) == (3, 4)  # the bonus
    assert verify_coupled([0, 2, 3], p, seed=5, position=10) == (0, 1)
    assert verify_coupled([], p[:1], seed=5, position=10) == (0, 1)  # no drafts: a cloud-only step


def test_a_token_p_rules_out_is_never_accepted():
    p = np.array([[0.0, 0.5, 0.5, 0.0, 0.0], [0.2] * 5])
    for seed in range(200):
        accepted, token = verify_coupled([0], p, seed, 3)
        assert accepted == 0 and token in (1, 2)


def test_the_verdict_is_the_target_sample_at_each_position():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(VOCAB), size=4)
    for seed in range(100):
        t = [coupled_token(p[j], seed, 20 + j) for j in range(4)]
        assert verify_coupled(t[:3], p, seed, 20) == (3, t[3])
        wrong = (t[1] + 1) % VOCAB
        assert verify_coupled([t[0], wrong, t[2]], p, seed, 20) == (1, t[1])


# ---- 2. a toy target and draft, generation by rounds --------------------------------------------

TARGET = np.random.default_rng(7).normal(size=(VOCAB, VOCAB, VOCAB)) * 1.5  # logits after (a, b)
NOISE = np.random.default_rng(8).normal(size=(VOCAB, VOCAB, VOCAB)) * 0.7


def target_p(context: list[int], temperature: float = 1.0) -> np.ndarray:
    return probs_from_logits(TARGET[context[-2], context[-1]], SamplingParams(temperature=temperature, seed=0))


def draft_q(context: list[int]) -> SparseDist:
    """Like the device: the draft's own (worse) logits at 0.8 T, cut to its top 3, sampled as is."""
    logits = TARGET[context[-2], context[-1]] + NOISE[context[-2], context[-1]]
    return truncate_top_n(probs_from_logits(logits, SamplingParams(temperature=0.8, seed=0)), 3)


def generate(seed: int, prompt: list[int], n: int, ks) -> tuple[list[int], int]:
    """Speculative rounds of k = next(ks) drafts (0: one cloud-only step). Returns (the first
    n generated tokens, drafts accepted)."""
    seq, accepted_total = list(prompt), 0
    draws = PositionDraws(seed)
    while len(seq) - len(prompt) < n:
        k = next(ks)
        drafts: list[int] = []
        for _ in range(k):  # the device: x_P = argmax q_P / E_P at the absolute position P
            drafts.append(sample(draft_q(seq + drafts), draws, len(seq) + len(drafts)))
        p = np.stack([target_p(seq + drafts[:j]) for j in range(k + 1)])  # one "forward"
        accepted, token = verify_coupled(drafts, p, seed, len(seq))
        accepted_total += accepted
        seq += drafts[:accepted] + [token]
    return seq[len(prompt) :][:n], accepted_total


PROMPT = [1, 3, 2]


@pytest.mark.parametrize("seed", range(12))
def test_one_seed_one_text_whatever_the_round_boundaries(seed):
    n = 30
    cloud_only, _ = generate(seed, PROMPT, n, itertools.repeat(0))
    schedules = {
        "k=1": itertools.repeat(1),
        "k=2": itertools.repeat(2),
        "k=4": itertools.repeat(4),
        "k=7": itertools.repeat(7),
        "k varies (adaptive)": iter(np.random.default_rng(seed).integers(0, 6, size=200).tolist()),
    }
    accepted = 0
    for name, ks in schedules.items():
        text, hits = generate(seed, PROMPT, n, ks)
        assert text == cloud_only, name
        accepted += hits
    assert accepted > 0  # drafts were accepted, not just corrected
    # A resume re-opens with the committed tokens as prompt: positions, hence draws, carry on.
    first, _ = generate(seed, PROMPT, 11, itertools.repeat(3))
    rest, _ = generate(seed, PROMPT + first, n - 11, itertools.repeat(2))
    assert first + rest == cloud_only


def test_different_seeds_give_different_texts():
    texts = {tuple(generate(seed, PROMPT, 20, itertools.repeat(4))[0]) for seed in (11, 12, 13)}
    assert len(texts) == 3


# ---- 3. the output distribution against p -------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2])
def test_coupled_rounds_follow_the_target_distribution(k):
    """The joint distribution of the first three generated tokens equals the target's, enumerated."""
    samples = 6000
    counts = np.zeros(VOCAB**3)
    for seed in range(samples):
        y, _ = generate(seed, PROMPT, 3, itertools.repeat(k))
        counts[y[0] * VOCAB**2 + y[1] * VOCAB + y[2]] += 1
    expected = np.zeros(VOCAB**3)
    for y in itertools.product(range(VOCAB), repeat=3):
        ctx, prob = list(PROMPT), 1.0
        for token in y:
            prob *= target_p(ctx)[token]
            ctx.append(token)
        expected[y[0] * VOCAB**2 + y[1] * VOCAB + y[2]] = prob
    keep = expected * samples >= 5  # chi-square's rule of thumb; the rest pooled
    observed = np.append(counts[keep], counts[~keep].sum())
    wanted = np.append(expected[keep], expected[~keep].sum()) * samples
    assert chisquare(observed, wanted).pvalue > 1e-4


def test_the_fit_test_can_fail():
    """The same check rejects the draft's distribution (what the draft alone would emit)."""
    samples = 6000
    counts = np.zeros(VOCAB)
    for seed in range(samples):
        counts[sample(draft_q(PROMPT), PositionDraws(seed), len(PROMPT))] += 1
    assert chisquare(counts, target_p(PROMPT) * samples).pvalue < 1e-4


# ---- 4. the batch adapter -----------------------------------------------------------------------


def coupled_row(key: int, cache_len: int, drafts: list[int], seed: int) -> Row:
    return Row(key=key, cache_len=cache_len, tokens=[0] + drafts, mode=Mode.COUPLED,
               sampling=SamplingParams(temperature=0.9, top_k=4, seed=seed), round_no=99)


def test_accept_rows_applies_the_rule_at_the_rows_absolute_position():
    torch.manual_seed(0)
    rows = [coupled_row(1, 6, [1, 2], 3), coupled_row(2, 40, [4], 5), coupled_row(3, 2, [], 7)]
    logits = [torch.randn(len(row.tokens), 8) for row in rows]
    together = accept_rows(rows, logits)
    for row, row_logits, outcome in zip(rows, logits, together):
        p = target_probs(row_logits, row.sampling).double().numpy()
        assert row.position == row.cache_len + 1  # the pending token is the last committed one
        assert tuple(outcome[:2]) == verify_coupled(row.drafts, p, row.sampling.seed, row.position)
        # p of the emitted token at its position: what a Generate step sends as token_probs
        assert outcome.next_prob == pytest.approx(p[outcome.accepted, outcome.next_token])
        assert accept_rows([row], [row_logits])[0] == outcome  # batch neighbours change nothing
    # round numbers play no part
    moved = dataclasses.replace(rows[0], round_no=0)
    assert accept_rows([moved], [logits[0]])[0] == together[0]


def test_generate_samples_with_the_coupled_rule():
    sampled = generate_from_proto(pb.GenerateRequest(prompt_ids=[1], sampling=pb.SamplingParams(temperature=0.7, seed=3)))
    assert sampled.mode is Mode.COUPLED and sampled.sampling.seed == 3
    assert generate_from_proto(pb.GenerateRequest(prompt_ids=[1])).mode is Mode.GREEDY


def test_a_generate_step_sends_the_probability_of_its_token_and_a_greedy_one_none():
    """``GenerateResponse.token_probs``: p(t) of the sampled token (the device's shadow draft
    estimates exact mode's acceptance from it); nothing for greedy."""
    from edgespec.cloud.serving.codec import generate_reply_to_proto
    from edgespec.cloud.serving.session import Finish, Verdict

    sampled = generate_reply_to_proto(Verdict(3, 0, 7, Finish.NONE, next_prob=0.25), draining=False)
    assert list(sampled.token_ids) == [7] and list(sampled.token_probs) == [0.25]
    greedy = generate_reply_to_proto(Verdict(3, 0, 7, Finish.NONE), draining=False)
    assert list(greedy.token_probs) == []
