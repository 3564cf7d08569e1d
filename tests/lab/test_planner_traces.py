"""lab/planner_traces.py's figures that need no recording (the experiment is loaded by path: lab/
is no package)."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def traces(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "lab"))  # its neighbour planner_grid
    spec = importlib.util.spec_from_file_location("planner_traces", REPO / "lab" / "planner_traces.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hits_by_position_pool_the_texts_that_reach_each_span(traces):
    hard_start = [False] * 8 + [True] * 8  # a 16-token reply, its opening missed
    short = [True] * 4 + [False] * 4  # an 8-token reply reaches the first span only
    spans = traces.by_position([hard_start, short], edges=(0, 8, 16, 32))
    assert spans == [(0, 8, 0.25), (8, 16, 1.0)]  # no span past the longest reply


def test_hits_by_position_cover_every_reply_by_default(traces):
    long = [True] * 8 + [False] * 292  # past the demo's 128 tokens
    assert traces.by_position([long])[-1] == (256, 512, 0.0)
