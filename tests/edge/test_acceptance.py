"""The planner's acceptance estimator (``acceptance.Acceptance``) and the replay of rounds over a
stream (``acceptance.Replay``)."""

from __future__ import annotations

import pytest

from edgespec.cloud.bench.theory import expected_tokens
from edgespec.edge.acceptance import Acceptance, Replay


def test_a_round_counts_its_accepted_drafts_and_one_rejection():
    acceptance = Acceptance(decay=1.0, shrink=0.0, prior=0.7)
    acceptance.add(2, 4)  # drafts 1 and 2 accepted, 3 rejected, 4 never reached
    acceptance.add(4, 4)  # all four accepted
    assert acceptance.reached == [2.0, 2.0, 2.0, 1.0] and acceptance.accepted == [2.0, 2.0, 1.0, 1.0]
    assert acceptance.by_position(4) == pytest.approx([0.99, 0.99, 0.5, 0.99])  # (never quite certain)


def test_a_block_sent_ahead_continues_the_positions_of_the_blocks_that_held():
    acceptance = Acceptance(decay=1.0, shrink=0.0, prior=0.7)
    acceptance.add(2, 2)  # positions 1, 2; the bonus guessed is position 3
    acceptance.add(1, 2, after=3, limit=5)  # position 4 accepted, 5 rejected
    assert acceptance.reached == [1.0, 1.0, 1.0, 1.0, 1.0] and acceptance.accepted == [1.0, 1.0, 1.0, 1.0, 0.0]
    acceptance.add(2, 2, after=5, limit=5)  # its bonus guess (position 5) kept, its drafts past the limit not
    assert acceptance.reached[4:] == [2.0] and acceptance.accepted[4:] == [1.0]


def test_with_one_acceptance_everywhere_a_round_commits_the_geometric_tokens():
    acceptance = Acceptance(decay=1.0, shrink=1.0, prior=0.6)  # nothing measured: the prior at every position
    tokens, holds = acceptance.tokens_and_holds(8)
    for k in range(1, 9):
        assert tokens[k] == pytest.approx(expected_tokens(0.6, k))
        assert holds[k] == pytest.approx(0.6 ** (k + 1))  # all k accepted and the bonus guessed


def test_a_position_seldom_reached_follows_the_one_before_it():
    """Short probing blocks that were always right say the longer ones will be too: positions
    past them take the deepest measured one's acceptance, not the prior's, so k can grow."""
    acceptance = Acceptance(decay=1.0, shrink=1.0, prior=0.5)
    for _ in range(20):
        acceptance.add(2, 2)
    c = acceptance.by_position(8)
    assert c[0] > 0.9 and c[7] == pytest.approx(c[1], abs=1e-9)
    tokens, _ = acceptance.tokens_and_holds(16)
    assert tokens[16] > 10


def test_a_hopeless_draft_shows_within_a_few_rounds():
    acceptance = Acceptance(decay=0.97, shrink=1.0, prior=0.7)
    for _ in range(3):
        acceptance.add(0, 4)
    tokens, _ = acceptance.tokens_and_holds(16)
    assert max(tokens) < 1.35


def test_old_rounds_fade_and_a_new_text_weighs_them_less():
    acceptance = Acceptance(decay=0.5, shrink=0.0, prior=0.7)
    acceptance.add(0, 1)
    acceptance.add(1, 1)  # the miss now weighs half the hit
    assert acceptance.by_position(1) == pytest.approx([1 / 1.5])
    before = acceptance.drafts()
    acceptance.forget(0.2)
    assert acceptance.drafts() == pytest.approx(0.2 * before) and acceptance.seen == 2.0


def test_hits_replay_as_the_greedy_rounds_they_would_have_been():
    """Chances of 1 and 0 (greedy hits, or a lookup's point mass) replay the exact rounds:
    drafts 1, 2 right and 3 wrong; then all four right (the fifth token is their bonus); then a
    miss at the first draft."""
    replay = Replay(4)
    reached, accepted, rounds = replay.feed([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    assert reached == [3, 2, 2, 1] and accepted == [2, 2, 1, 1] and rounds == 3


def test_fractional_chances_replay_the_expected_rounds():
    replay = Replay(2)
    reached, accepted, rounds = replay.feed([0.5] * 400)
    assert accepted == pytest.approx([0.5 * r for r in reached])  # each position accepted half the time
    assert reached[1] == pytest.approx(0.5 * reached[0], rel=0.05)  # the second reached after a hit
    assert sum(reached) / rounds == pytest.approx(1.5, rel=0.05)  # drafts per round: the first, and the second half the time
    replay.restart()
    assert replay.feed([1.0])[0] == [1.0, 0.0]  # after a gap, a fresh block
