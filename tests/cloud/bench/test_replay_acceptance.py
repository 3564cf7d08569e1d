"""The workload's acceptance, read off the replay scripts, is what a greedy device meets at k."""

from edgespec.cloud.bench.replay import Script, acceptance_by_position


def test_acceptance_by_position_follows_the_rounds_a_device_drafts():
    # The draft is right everywhere but at output positions 3 and 7.
    script = Script([1], list(range(10)), [0, 1, 2, 99, 4, 5, 6, 99, 8, 9])
    # Rounds at k=4: [0..3] accepts 3, [4..7] accepts 3, [8] (one token left to draft) accepts 1.
    assert acceptance_by_position([script], 4) == (1.0, 1.0, 1.0, 0.0)
    # At k=2, rounds start at 0, 3, 4, 7, 8: position 0 passes at 0, 4, 8 (not at 3, 7);
    # position 1 is only drafted behind a passed position 0 (at 0 and 4) and passes both times.
    assert acceptance_by_position([script], 2) == (3 / 5, 1.0)


def test_a_draft_that_is_always_wrong_accepts_nothing():
    script = Script([1], [5] * 8, [6] * 8)
    assert acceptance_by_position([script], 3) == (0.0, 0.0, 0.0)
