"""bench links prints k=auto's decisions: the planner's switch log, from each result's stats."""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace

from edgespec.cloud.bench.links import decision_text, decisions_markdown, switch_log
from edgespec.edge.planner import Switch

LOG = [Switch(0, None, "speculative", 5.1, 8.8, "exploring the draft"),
       Switch(37, "speculative", "cloud_only", 14.3, 8.8, "unpromising: P(win) 0.04")]


def test_the_switch_log_comes_from_the_stats_when_they_carry_it():
    assert switch_log(SimpleNamespace(stats=SimpleNamespace(switch_log=LOG))) == [asdict(s) for s in LOG]
    assert switch_log(SimpleNamespace(stats=SimpleNamespace(switch_log=[asdict(s) for s in LOG]))) == [asdict(s) for s in LOG]
    assert switch_log(SimpleNamespace(stats=SimpleNamespace())) == []  # stats without it: nothing to print


def test_each_decision_shows_its_two_predictions():
    start, switch = (decision_text(asdict(s)) for s in LOG)
    assert start == "start speculative (spec 5.1 / cloud 8.8 ms/token: exploring the draft)"
    assert switch == "@37 speculative -> cloud_only (spec 14.3 / cloud 8.8 ms/token: unpromising: P(win) 0.04)"
    lines = decisions_markdown([{"profile": "4g", "decisions": [[asdict(s) for s in LOG], []]}])
    assert "| 4g | 1 | 37 | speculative | cloud_only | 14.3 | 8.8 | unpromising: P(win) 0.04 |" in lines
    assert decisions_markdown([{"profile": "4g", "decisions": [[]]}]) == []
