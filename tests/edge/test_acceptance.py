"""The Beta posterior on per-position acceptance (the link's break-even a* is the planner's: test_planner.py)."""

from __future__ import annotations

import pytest
from scipy import stats

from edgespec.edge.acceptance import Acceptance, beta_upper_tail


@pytest.mark.parametrize("x", [1e-4, 0.05, 0.2, 0.45, 0.6, 0.9, 0.9999])
@pytest.mark.parametrize("a, b", [(0.5, 0.5), (0.5, 2.5), (3.5, 1.5), (20.5, 8.5), (1.5, 40.5)])
def test_the_upper_tail_matches_scipy(x, a, b):
    assert beta_upper_tail(x, a, b) == pytest.approx(stats.beta.sf(x, a, b), abs=1e-10)


def test_rounds_count_accepted_drafts_and_one_rejection():
    acceptance = Acceptance()
    acceptance.add(2, 4)  # two accepted, the third rejected
    acceptance.add(4, 4)  # all four accepted: no rejection was seen
    assert acceptance.posterior == (0.5 + 6, 0.5 + 1)
    for _ in range(40):
        acceptance.add(0, 1)
    assert len(acceptance) == 16  # the recent rounds only
    assert acceptance.chance_at_least(0.2) < 0.01


def test_a_new_texts_chance_is_the_share_of_texts_that_reached_it():
    from edgespec.edge.acceptance import TEXT_DRAFTS, Acceptance

    acc = Acceptance()
    assert acc.new_text_chance_at_least(0.5) is None  # no text ended yet
    for accepted in (4, 4, 0):  # two texts at 0.8 a draft (4 of 5 each round), one at 0 (1 reached a round)
        for _ in range(8):
            acc.add(accepted, 5)
        acc.end_text()
    assert list(acc.texts) == pytest.approx([0.8, 0.8, 0.0])
    assert acc.new_text_chance_at_least(0.5) == pytest.approx(2 / 3)
    assert acc.new_text_chance_at_least(0.9) == 0.0
    acc.add(0, 2)  # a text of fewer than TEXT_DRAFTS drafts observed does not count
    acc.end_text()
    assert len(acc.texts) == 3 and TEXT_DRAFTS > 2


def test_acceptance_by_position_kept_as_rounds_come_and_go_equals_summing_them():
    """The running sums (rounds leaving the recent window and the history) give what summing
    every kept round again gives, over verified and replayed (fractional) rounds alike."""
    import random

    from edgespec.edge.acceptance import PRIOR, ROUNDS, SHRINK

    def summed(acc, k):
        reached, accepted = [0.0] * k, [0.0] * k
        history = list(acc.history)
        for r, a in history + history[-ROUNDS:]:
            for i in range(min(k, len(r))):
                reached[i] += r[i]
            for i in range(min(k, len(a))):
                accepted[i] += a[i]
        mean = (sum(accepted) + PRIOR) / (sum(reached) + 2 * PRIOR)
        return [min((accepted[i] + SHRINK * mean) / (reached[i] + SHRINK), 0.995) for i in range(k)]

    rng, acc = random.Random(1), Acceptance()
    for _ in range(600):
        k = rng.randint(1, 16)
        if rng.random() < 0.5:
            acc.add(rng.randint(0, k), k)
        else:
            reached = [rng.random() for _ in range(k)]
            acc.add_counts(reached, [x * rng.random() for x in reached])
        for kk in (1, 5, 17):
            assert acc.by_position(kk) == pytest.approx(summed(acc, kk), abs=1e-9)


def test_a_texts_prior_is_what_the_last_texts_did_and_a_text_unlike_them_escapes_it():
    """Two early misses of a draft that was right on 0.9 of every earlier text are no verdict on
    this text (Jeffreys' prior alone says it can hardly win); a text far below the last ones is
    judged on its own rounds as before; texts that differ give a loose prior."""
    from edgespec.edge.acceptance import PRIOR, TEXT_PRIOR_DRAFTS, TEXT_PRIOR_TEXTS

    def texts(acc: Acceptance, accepted_of_10: list[int]) -> None:
        for accepted in accepted_of_10:
            for _ in range(8):
                acc.add(accepted, 10)  # ``accepted`` + 1 reached (9: all 10, 0.9 a draft)
            acc.end_text()

    acc = Acceptance()
    texts(acc, [9] * (TEXT_PRIOR_TEXTS - 1))
    assert acc.text_prior() is None
    acc.add(1, 10)
    acc.add(0, 10)  # a new text: 1 accepted, 2 rejected
    jeffreys = beta_upper_tail(0.8, PRIOR + 1, PRIOR + 2)
    assert acc.text_chance_at_least(0.8) == pytest.approx(jeffreys) and jeffreys < 0.1

    acc = Acceptance()
    texts(acc, [9] * 6)
    alpha, beta = acc.text_prior()
    assert alpha / (alpha + beta) == pytest.approx(0.9) and alpha + beta == pytest.approx(TEXT_PRIOR_DRAFTS)
    acc.add(1, 10)
    acc.add(0, 10)
    assert acc.text_chance_at_least(0.8) > 0.2  # the same two rounds: no verdict yet
    for _ in range(3):
        acc.add(0, 10)  # five rounds, one draft accepted: a text unlike the last ones
    assert acc.text_chance_at_least(0.8) < 0.01
    assert acc.text_chance_at_least(0.8) == pytest.approx(beta_upper_tail(0.8, PRIOR + 1, PRIOR + 5), abs=0.005)

    acc = Acceptance()
    texts(acc, [9, 0, 9, 1, 9, 0])  # texts that differ: 0.9, 0 (one draft reached a round), 0.9, 0.5, 0.9, 0
    alpha, beta = acc.text_prior()
    assert alpha + beta < TEXT_PRIOR_DRAFTS / 2
