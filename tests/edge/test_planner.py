"""The planner through its public surface: ``PlannerConfig``, events into ``observe`` and the
pure ``decide``. Every figure is an event's, so every decision here is the same on any machine."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from edgespec.edge.planner import (FirstToken, Info, Path, Planner, PlannerConfig, Round, Segment, Shadowed, Start,
                                   Streamed, decide, shadow_wanted)

SPEC, CLOUD = Path.SPECULATIVE, Path.CLOUD_ONLY


def ms(value: float | None) -> float:
    assert value is not None
    return value


def planner(rtt_ms: float, *, forward_ms: float = 8.0, stream_ms: float = 9.0, mode: str = "auto",
            send_ahead: int | str = 1, budget: int = 128, config: PlannerConfig | None = None) -> Planner:
    """A client's planner after its Info call, at a request's start."""
    p = Planner(mode, config)
    p.observe(Info(forward_ms=forward_ms, decode_ms=stream_ms - 1.0, stream_ms=stream_ms, rtt_ms=rtt_ms))
    p.observe(Start(budget, max_k=16, send_ahead=send_ahead))
    return p


def speculate(p: Planner, rounds: int, *, k: int, accepted: int, rtt_ms: float, forward_ms: float = 8.0,
              device_ms: float = 1.0) -> None:
    """``rounds`` fresh rounds of k drafts as the driver reports them (the first carries the Open)."""
    p.observe(Segment(SPEC))
    for i in range(rounds):
        wait = rtt_ms + forward_ms + (30.0 if i == 0 else 0.0)
        p.observe(Round(k, accepted, accepted + 1, wait + device_ms, wait, forward_ms, None if i == 0 else device_ms))


def test_bad_knobs_are_refused_by_name():
    bad_knobs: list[dict[str, Any]] = [dict(margin=1.0), dict(max_depth=0), dict(acceptance_decay=0.0),
                                       dict(bias_limit=0.5), dict(shrink=-1.0), dict(window=0)]
    for bad in bad_knobs:
        with pytest.raises(ValueError, match=next(iter(bad))):
            PlannerConfig(**bad)
    with pytest.raises(ValueError, match="sometimes"):
        Planner("sometimes")


def test_nothing_measured_means_speculate_and_learn():
    p = Planner()
    p.observe(Start(64))
    assert p.decide(None, 64).path is SPEC and p.switch_log[0].reason.startswith("nothing measured")


def test_an_unknown_draft_is_tried_on_a_near_link_and_judged_by_the_shadow_on_a_far_one():
    assert planner(1.0).decide(None, 128).path is SPEC
    assert planner(600.0).decide(None, 128).path is CLOUD


def test_fixed_modes_keep_their_path_and_a_fixed_k_its_k():
    p = planner(600.0, mode="speculative")
    p.observe(Start(128, k=4))
    decision = p.decide(None, 128)
    assert decision.path is SPEC and decision.k == 4
    assert planner(0.1, mode="cloud_only").decide(SPEC, 128).path is CLOUD


def test_a_hopeless_draft_is_left_on_its_second_round():
    p = planner(15.0)
    p.decide(None, 128)
    p.observe(Segment(SPEC))
    p.observe(Round(4, 0, 1, 54.0, 53.0, 8.0))  # the first round carried the Open: no rate yet
    assert p.decide(SPEC, 127).path is SPEC
    p.observe(Round(1, 0, 1, 24.0, 23.0, 8.0, 0.5))
    assert p.decide(SPEC, 126).path is CLOUD
    assert [s.to_path for s in p.switch_log] == ["speculative", "cloud_only"]
    switch = p.switch_log[-1]
    assert ms(switch.predicted_spec_ms_per_token) > ms(switch.predicted_cloud_ms_per_token)


def test_a_good_draft_stays_and_grows_its_blocks():
    p = planner(15.0)
    p.decide(None, 128)
    speculate(p, 6, k=4, accepted=4, rtt_ms=15.0)
    decision = p.decide(SPEC, 100)
    assert decision.path is SPEC and decision.k > 8


def test_a_switch_must_repay_its_cost():
    """Near a request's end the stream may be cheaper per token, yet not by two switches."""
    p = planner(15.0)
    p.decide(None, 128)
    speculate(p, 4, k=1, accepted=0, rtt_ms=15.0)
    assert p.decide(SPEC, 100).path is CLOUD
    speculate(p, 4, k=1, accepted=0, rtt_ms=15.0)
    assert p.decide(SPEC, 2).path is SPEC


def test_the_stream_is_left_once_the_shadow_vouches_for_the_draft_and_a_probe_measured_the_link():
    p = planner(1.0, config=PlannerConfig(min_stream_tokens=8))
    p.observe(Segment(CLOUD))
    p.observe(FirstToken(40.0))
    p.observe(Shadowed(tuple([1.0] * 40)))
    p.observe(Streamed(9.0 * 4, 4))
    assert p.decide(CLOUD, 100).path is CLOUD  # too few streamed tokens for a rate
    p.observe(Streamed(9.0 * 10, 10))
    assert p.decide(CLOUD, 100).path is CLOUD  # no round trip probed beside this stream yet
    p.observe(Info(rtt_ms=1.0))
    assert p.decide(CLOUD, 100).path is SPEC


def test_the_stream_stays_where_no_block_repays_the_round_trip():
    p = planner(600.0)
    p.observe(Segment(CLOUD))
    p.observe(Shadowed(tuple([1.0] * 64)))
    p.observe(Streamed(9.0 * 20, 20))
    p.observe(Info(rtt_ms=600.0))
    assert p.decide(CLOUD, 100).path is CLOUD


def test_blocks_go_ahead_on_a_far_link_when_they_hold_and_never_when_told_not_to():
    far = planner(60.0, send_ahead="auto")
    speculate(far, 6, k=8, accepted=8, rtt_ms=60.0)
    assert far.decide(SPEC, 100).depth > 1
    assert planner(60.0, send_ahead=1).decide(SPEC, 100).depth == 1
    told = planner(60.0, send_ahead=3)
    assert told.decide(SPEC, 100).depth == 3


def test_blocks_that_seldom_hold_are_not_sent_ahead():
    p = planner(60.0, send_ahead="auto")
    speculate(p, 12, k=2, accepted=0, rtt_ms=60.0)
    assert p.decide(SPEC, 100).depth == 1


def test_short_blocks_sent_ahead_that_hold_grow_k_past_an_early_rejection():
    """A first long block rejected at its fifth draft, then blocks of three sent ahead that all
    hold (as a bench run on WiFi met it): a chain that holds is one long block, so the deep
    positions learn from it and k grows, instead of staying at three for the whole text."""
    p = planner(20.0, mode="speculative", send_ahead="auto")
    p.observe(Segment(SPEC))
    p.observe(Round(16, 0, 1, 90.0, 88.0, 16.0))  # the Open's round
    p.observe(Round(16, 4, 5, 45.0, 40.0, 16.0, 4.0))
    assert p.decide(SPEC, 100).k <= 4
    p.observe(Round(3, 3, 4, 40.0, 38.0, 13.0, 1.0))
    for _ in range(10):
        p.observe(Round(3, 3, 4, 14.0, None, 13.0, 1.0))  # sent ahead, and held
    assert p.decide(SPEC, 80).k >= 8


def test_sending_ahead_makes_speculation_cheaper_in_the_forecast():
    one, ahead = planner(60.0), planner(60.0, send_ahead="auto")
    for p in (one, ahead):
        speculate(p, 6, k=8, accepted=8, rtt_ms=60.0)
    assert ms(ahead.decide(SPEC, 100).spec_ms) < ms(one.decide(SPEC, 100).spec_ms)


def test_rounds_slower_than_predicted_raise_speculations_price():
    steady, slow = planner(15.0), planner(15.0)
    speculate(steady, 6, k=4, accepted=4, rtt_ms=15.0)
    slow.observe(Segment(SPEC))
    for i in range(6):  # each round's wall is half again what its parts account for
        wait = 15.0 + 8.0 + (30.0 if i == 0 else 0.0)
        slow.observe(Round(4, 4, 5, 1.5 * (wait + 1.0), wait, 8.0, 1.0))
    assert ms(slow.decide(SPEC, 100).spec_ms) > 1.2 * ms(steady.decide(SPEC, 100).spec_ms)


def test_the_last_streams_measured_rate_is_the_cloud_price_and_the_replica_figure_before_it():
    p = planner(15.0, stream_ms=9.0)
    assert p.decide(SPEC, 100).cloud_ms == pytest.approx(9.0)
    p.observe(Segment(CLOUD))
    p.observe(Streamed(12.0 * 4, 4))  # too few tokens for a rate
    assert p.decide(SPEC, 100).cloud_ms == pytest.approx(9.0)
    p.observe(Streamed(12.0 * 10, 10))
    assert p.decide(SPEC, 100).cloud_ms == pytest.approx(12.0)
    for rate in (200.0, 11.0):  # a stream that stalled is one of the last few
        p.observe(Segment(CLOUD))
        p.observe(Streamed(rate * 10, 10))
    assert p.decide(SPEC, 100).cloud_ms == pytest.approx(12.0)


def test_decide_is_pure():
    p = planner(15.0)
    speculate(p, 3, k=4, accepted=2, rtt_ms=15.0)
    before = pickle.dumps(p.state)
    first = decide(p.state, p.config, p.mode, SPEC, 100)
    assert decide(p.state, p.config, p.mode, SPEC, 100) == first and pickle.dumps(p.state) == before


def test_the_shadow_watches_every_token_while_cheap_and_a_share_of_them_when_not():
    p = planner(15.0)
    p.observe(Shadowed(tuple([1.0] * 32), draft_ms=32 * 0.1))  # 0.1 ms a token beside a 9 ms stream
    assert all(shadow_wanted(p.state, p.config, i) for i in range(256))
    p.observe(Shadowed(tuple([1.0] * 32), draft_ms=32 * 3.0))
    p.observe(Shadowed(tuple([1.0] * 32), draft_ms=32 * 3.0))  # now 3 ms a token: a third of the stream
    watched = sum(shadow_wanted(p.state, p.config, i) for i in range(4096)) / 4096
    assert watched * 3.0 <= 1.1 * p.config.shadow_share * 9.0
