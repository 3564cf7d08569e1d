"""The planner against a scripted link, clock and verifier (``edgespec.cloud.simulate.planner``): each path
made the faster one in turn, hopeless and slow-starting drafts, sampled requests. No wall clock:
every figure the planner sees is the script's, so every run is the same."""

from __future__ import annotations

from typing import Callable

import pytest

from edgespec.cloud.simulate.planner import (Sim, World, always_speculating_ms, bernoulli_hits, cloud_only_ms, compare,
                                             rtt_phases)
from edgespec.edge.planner import PlannerConfig

# Links like bench links' profiles (median round trip through the emulator, ms).
LINKS = {"loopback": 0.3, "lan": 1.0, "wifi": 15.0, "5g": 33.0, "4g": 61.0, "satellite": 625.0}
DRAFTS = {"good": 0.9, "fair": 0.7, "hopeless": 0.0}


def world(rtt: float | list[tuple[int, float]], hits: Callable[[int], bool] | float, **kw) -> World:
    phases = [(0, rtt)] if isinstance(rtt, (int, float)) else rtt
    return World(rtt_ms=rtt_phases(*phases), hits=hits if callable(hits) else bernoulli_hits(hits, seed=7), **kw)


def test_each_switch_goes_the_right_way_within_a_few_rounds():
    """A draft that is always right over a link that turns slow at token 150 (a round trip no
    block can repay) and fast again at token 400: speculation, cloud-only, speculation."""
    slow_at, fast_at = 150, 400
    sim = Sim(world([(0, 2.0), (slow_at, 250.0), (fast_at, 2.0)], hits=lambda _: True))
    run = sim.generate(600)
    paths = [path for path, _ in run.segments]
    assert paths == ["speculative", "cloud_only", "speculative"], run.segments
    left = run.first_switch_after(slow_at, "cloud_only")
    back = run.first_switch_after(fast_at, "speculative")
    assert left is not None and left - slow_at <= 4 * 17, run.switches  # within four rounds of 17 tokens
    assert back is not None and back - fast_at <= 48, run.switches  # three round-trip probes and the evidence
    for switch in run.switches[1:]:  # each went the way its predictions pointed
        faster = switch.predicted_spec_ms_per_token < switch.predicted_cloud_ms_per_token
        assert faster == (switch.to_path == "speculative"), switch


def test_the_way_back_holds_across_requests_and_never_flaps():
    """Requests of 128 tokens, the link slow from the second to the fourth: each request's path
    follows the link within one request, and no request switches more than twice."""
    sim = Sim(world([(0, 2.0), (128, 250.0), (4 * 128, 2.0)], hits=0.95))
    runs = [sim.generate(128) for _ in range(7)]
    assert runs[0].segments == [("speculative", 128)]
    for run in runs[2:4]:  # the link is slow: streamed from the start
        assert run.segments == [("cloud_only", 128)], run.segments
    assert runs[-1].segments == [("speculative", 128)]
    assert all(len(run.switches) <= 3 for run in runs)


@pytest.mark.parametrize("link", ["loopback", "lan", "wifi", "5g", "4g", "satellite"])
@pytest.mark.parametrize("draft", ["good", "fair", "hopeless"])
def test_auto_is_as_fast_as_the_faster_path(link, draft):
    """Four requests of 128 tokens on a fresh device, over eight texts (seeds): k=auto within 5%
    of the faster of cloud-only and always speculating, the goal bench links measures (here
    with one block in flight). Where the two paths are within ~15% of each other each request's
    text decides which one wins, and the planner, which must guess from the text so far (and
    explores a draft it does not know), is allowed 8%."""
    t = compare(World(rtt_ms=rtt_phases((0, LINKS[link])), hits=bernoulli_hits(DRAFTS[draft], seed), forward_ms=6.0,
                      forward_per_draft_ms=0.5, decode_ms=8.0, message_ms=0.8) for seed in range(8))
    auto, cloud, spec = t.auto, t.cloud, t.spec
    close = abs(cloud / spec - 1) < 0.15
    assert auto <= min(cloud, spec) / (0.92 if close else 0.95), (auto, cloud, spec)


@pytest.mark.parametrize("link", ["loopback", "lan", "wifi", "5g", "4g"])
def test_a_hopeless_draft_costs_its_first_request_little(link):
    """A draft that never agrees, as lab/first_request.py runs one (a verify forward costs
    what a decoding step does, the draft a tenth of it per token). On a fresh device the
    planner tries the draft first where a hopeless one loses little (a second round and a
    switch: under ``explore_loss``), else streams and lets the shadow judge it."""
    w = world(LINKS[link], 0.0, forward_ms=8.0, forward_per_draft_ms=0.5, decode_ms=8.0, message_ms=0.8, draft_ms=0.8)
    sim = Sim(w)
    run = sim.generate(128)
    assert run.speculative_tokens() <= 6  # left within three rounds of a token, or never tried
    # (within ``explore_loss`` of the request, give or take the verify forward's growth with k,
    # which no round has measured yet when the planner prices the exploration)
    assert cloud_only_ms(w, 128) / run.ms >= 1 - 1.2 * PlannerConfig().explore_loss, run.switches
    assert sim.generate(128).segments == [("cloud_only", 128)]  # and the next request streams


def test_a_good_draft_that_starts_slowly_is_not_given_up():
    """Each text opens hard (tau ~2) and goes on easy: the planner may leave on the opening,
    but the shadow brings it back within the request, and over the requests it costs at most
    the two switches more than always speculating."""
    def rate(position: int) -> float:
        return 0.45 if position % 128 < 12 else 0.93
    w = world(15.0, bernoulli_hits(rate, seed=3), forward_ms=6.0, forward_per_draft_ms=0.5, decode_ms=8.0)
    sim = Sim(w)
    runs = [sim.generate(128) for _ in range(4)]
    auto = sum(run.ms for run in runs)
    spec = sum(always_speculating_ms(w, 128, 128 * i) for i in range(4))
    cloud = sum(cloud_only_ms(w, 128, 128 * i) for i in range(4))
    assert auto <= spec / 0.9 and cloud / auto >= 1.5, (auto, spec, cloud)
    for run in runs:  # left at most briefly, and back within the request
        assert run.segments[-1][0] == "speculative" and run.speculative_tokens() >= 80, [r.segments for r in runs]


def test_a_hard_passage_in_the_middle_of_a_text_is_ridden_out():
    """Every text has 20 hard tokens (30-50) in easy text on a near link: leaving for them
    would stream the easy rest too; k=auto stays within 5% of always speculating."""
    def rate(position: int) -> float:
        return 0.2 if 30 <= position % 128 < 50 else 0.92
    t = compare(world(1.7, bernoulli_hits(rate, seed), forward_ms=8.0, forward_per_draft_ms=0.3, decode_ms=7.5,
                      message_ms=1.0, device_ms=2.5, draft_ms=0.3) for seed in range(8))
    auto, cloud, spec = t.auto, t.cloud, t.spec
    assert spec < cloud / 1.5 and auto <= spec / 0.95, (auto, spec, cloud)


def test_a_new_text_after_a_hard_one_comes_back_on_its_own_opening():
    """Texts differ: a hard text must not send the next, easy one to the stream for good. The
    next request may start streaming on what the hard one said, but the shadow watches the new
    text's opening whole and brings speculation back early in it."""
    def rate(position: int) -> float:
        return 0.1 if 256 <= position < 384 else 0.95  # two easy texts, a hard one, easy ones again
    w = world(15.0, bernoulli_hits(rate, seed=5), forward_ms=6.0, forward_per_draft_ms=0.5, decode_ms=8.0)
    sim = Sim(w)
    runs = [sim.generate(128) for _ in range(5)]
    assert runs[2].segments[-1][0] == "cloud_only"  # the hard text: left
    for run in runs[3:]:
        assert run.speculative_tokens() >= 88, [r.segments for r in runs]


def test_after_a_hard_sampled_text_the_next_ones_speculate():
    """Sampled, the shadow's chances (not hits) bring a fair text after a hard one back the
    same way."""
    def chance(position: int) -> float:
        return 0.2 if 256 <= position < 384 else 0.7  # two fair texts, a hard one, fair ones again

    w = world(0.3, bernoulli_hits(chance, seed=3), chances=chance, forward_ms=10.0, forward_per_draft_ms=0.5, decode_ms=8.0)
    sim = Sim(w, sampled=True)
    runs = [sim.generate(128) for _ in range(5)]
    for run in runs[3:]:
        assert run.speculative_tokens() >= 88, [r.segments for r in runs]


def test_sampled_requests_come_back_from_a_slow_link():
    """Sampled: the shadow reports each streamed token's acceptance chance, not a hit; the way
    back to speculation is the greedy one."""
    def chance(position: int) -> float:
        return 0.9

    w = world([(0, 2.0), (100, 250.0), (300, 2.0)], hits=bernoulli_hits(chance, seed=5), chances=chance)
    sim = Sim(w, sampled=True)
    run = sim.generate(500)
    assert [path for path, _ in run.segments] == ["speculative", "cloud_only", "speculative"], run.segments
    back = run.first_switch_after(300, "speculative")
    assert back is not None and back - 300 <= 48


def test_the_shadow_costs_a_bounded_share_of_the_stream():
    """A draft as slow per token as the stream itself: the shadow runs over at most
    ``shadow_share`` of the stream's time."""
    w = world(250.0, 0.9, draft_ms=8.0, decode_ms=8.0)
    sim = Sim(w)
    run = sim.generate(1024)
    streamed = sum(n for path, n in run.segments if path == "cloud_only")
    assert streamed > 900
    config = PlannerConfig()
    first_look = 2 * config.shadow_look  # (before the shadow's own cost is measured, it watches)
    assert 0 < run.shadowed and (run.shadowed - first_look) * w.draft_ms <= 1.5 * config.shadow_share * streamed * w.decode_ms


def test_a_hopeless_draft_streams_and_every_decision_is_logged():
    w = world(15.0, 0.0)
    sim = Sim(w)
    runs = [sim.generate(256) for _ in range(4)]
    for run in runs[1:]:
        assert [s.to_path for s in run.switches] == ["cloud_only"], run.switches
        start = run.switches[0]
        assert start.from_path is None and start.predicted_spec_ms_per_token > start.predicted_cloud_ms_per_token


@pytest.mark.parametrize("seed", range(4))
def test_a_short_first_request_lets_the_shadow_vouch_for_the_next_one(seed):
    """A client's first request, 16 tokens on a far link, streams (trying a draft nothing is
    known of would risk more than ``explore_loss`` of it) and its shadow watches the draft; a
    good one speculates for most of the next request, a hopeless one's next request streams."""
    def first_two(rate: float):
        # (the round trip as the client's Info probe measured it through the emulator and Serve)
        sim = Sim(world(40.0, bernoulli_hits(rate, seed), forward_ms=12.0, decode_ms=8.8, message_ms=1.0, prefill_ms=50.0))
        return sim.generate(16), sim.generate(128)

    warm, run = first_two(0.95)
    assert warm.segments == [("cloud_only", 16)]
    assert run.speculative_tokens() >= 100, run.switches
    warm, run = first_two(0.0)
    assert warm.segments == [("cloud_only", 16)] and run.segments == [("cloud_only", 128)], run.switches


@pytest.mark.parametrize("seed", range(3))
def test_a_hard_text_after_easy_ones_is_left_within_its_first_rounds(seed):
    """Three easy texts, then a hard one: it starts speculating on what the easy ones said, and
    its own first rounds, which a new text's prior does not outweigh, leave it."""
    def rate(position: int) -> float:
        return 0.3 if 384 <= position < 512 else 0.92
    w = world(33.0, bernoulli_hits(rate, seed), forward_ms=6.0, forward_per_draft_ms=0.5, decode_ms=8.0)
    sim = Sim(w)
    hard = [sim.generate(128) for _ in range(4)][3]
    assert hard.switches[0].to_path == "speculative"  # the easy texts before said so
    left = hard.first_switch_after(0, "cloud_only")
    assert left is not None and left <= 8, [(s.at_token, s.to_path, s.reason) for s in hard.switches]
    assert hard.ms <= 1.25 * cloud_only_ms(w, 128, 384), (hard.ms, cloud_only_ms(w, 128, 384))


@pytest.mark.parametrize("seed", range(4))
def test_early_misses_in_a_text_like_the_last_ones_are_no_reason_to_leave(seed):
    """Texts on which the draft is right 0.96 of the time but that open with a miss or two:
    judged with the last texts' rounds, such a text speculates on."""
    easy = bernoulli_hits(0.96, seed)
    w = world(33.0, lambda p: p % 128 not in (1, 3) and easy(p), forward_ms=8.0, forward_per_draft_ms=0.3,
              decode_ms=7.5, message_ms=1.0, device_ms=2.5, draft_ms=0.2)
    sim = Sim(w)
    runs = [sim.generate(128) for _ in range(8)][4:]
    spec = sum(always_speculating_ms(w, 128, 128 * i) for i in range(4, 8))
    assert sum(len(run.switches) - 1 for run in runs) <= 2, [[(s.at_token, s.to_path) for s in r.switches] for r in runs]
    assert sum(run.ms for run in runs) <= spec / 0.93


@pytest.mark.parametrize("seed", range(3))
def test_a_hard_text_after_many_alike_is_left_within_its_first_rounds(seed):
    """After six texts at 0.92, a text at 0.3 is still left within its first rounds."""
    def rate(position: int) -> float:
        return 0.3 if 768 <= position < 896 else 0.92
    w = world(33.0, bernoulli_hits(rate, seed), forward_ms=6.0, forward_per_draft_ms=0.5, decode_ms=8.0)
    sim = Sim(w)
    hard = [sim.generate(128) for _ in range(7)][6]
    left = hard.first_switch_after(0, "cloud_only")
    assert left is not None and left <= 8, [(s.at_token, s.to_path, s.reason) for s in hard.switches]


