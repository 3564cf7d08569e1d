"""Per-request statistics: counters and the rates derived from them."""

from __future__ import annotations

import pytest

from edgespec.edge.stats import RequestStats


def test_stats_rates():
    stats = RequestStats()
    stats.record_round(4, 4, 5)
    stats.record_round(4, 1, 2)
    stats.record_round(2, 0, 1)
    stats.wall_s = 0.8
    assert stats.acceptance_rate == pytest.approx(5 / 10)
    assert stats.mean_acceptance_length == pytest.approx(8 / 3)
    assert stats.acceptance_by_position == pytest.approx([2 / 3, 1 / 3, 1 / 2, 1 / 2])
    assert stats.target_calls_per_token == pytest.approx(3 / 8)
    assert stats.ms_per_token == pytest.approx(100.0)
    assert "mean acceptance length 2.67" in stats.summary()


def test_stats_combined_weighs_every_round_alike():
    a, b = RequestStats(), RequestStats()
    a.record_round(4, 4, 5)
    a.wall_s = 0.05
    b.record_round(2, 0, 1)
    b.record_round(2, 1, 2)
    b.wall_s = 0.25
    both = RequestStats.combined([a, b])
    assert (both.rounds, both.drafted, both.accepted, both.generated) == (3, 8, 5, 8)
    assert both.acceptance_by_position == pytest.approx([2 / 3, 1 / 3, 1.0, 1.0])
    assert both.mean_acceptance_length == pytest.approx(8 / 3)
    assert both.ms_per_token == pytest.approx(1000 * 0.3 / 8)
    assert both.k_history == [4, 2, 2]
    assert a.drafted_at == [1, 1, 1, 1]  # the inputs are left alone
