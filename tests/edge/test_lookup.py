"""Context lookup for greedy drafting (edgespec.edge.lookup): pure logic."""

from __future__ import annotations

import pytest

from edgespec.edge.lookup import LookupConfig, lookup_next


def test_the_longest_suffix_wins_over_a_more_recent_shorter_one():
    tokens = [1, 2, 3, 4, 9, 2, 3, 7, 1, 2, 3]
    # suffix [1, 2, 3] occurred at 0 (then 4); the shorter [2, 3] last occurred at 5 (then 7)
    assert lookup_next(tokens, LookupConfig(max_n=4, min_n=2)) == 4
    assert lookup_next(tokens, LookupConfig(max_n=2, min_n=2)) == 7


def test_the_most_recent_occurrence_wins():
    tokens = [5, 6, 1, 0, 5, 6, 2, 0, 5, 6]
    assert lookup_next(tokens, LookupConfig(max_n=4, min_n=2)) == 2


def test_no_match_below_min_n_gives_none():
    assert lookup_next([1, 2, 3, 4, 5], LookupConfig(max_n=4, min_n=2)) is None
    assert lookup_next([1, 2, 3, 1], LookupConfig(max_n=4, min_n=2)) is None
    assert lookup_next([1, 2, 3, 1], LookupConfig(max_n=4, min_n=1)) == 2
    assert lookup_next([], LookupConfig()) is None
    assert lookup_next([7], LookupConfig(max_n=4, min_n=1)) is None


def test_the_window_bounds_the_search():
    tokens = [1, 2, 3] + [0] * 20 + [1, 2]
    assert lookup_next(tokens, LookupConfig(max_n=2, min_n=2, window=30)) == 3
    assert lookup_next(tokens, LookupConfig(max_n=2, min_n=2, window=10)) is None


@pytest.mark.parametrize("kwargs", [dict(min_n=0), dict(min_n=3, max_n=2), dict(max_n=4, window=4)])
def test_config_validation_names_the_fields(kwargs):
    with pytest.raises(ValueError, match="min_n|window"):
        LookupConfig(**kwargs)
