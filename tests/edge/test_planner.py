"""The path planner: speculation or cloud-only from measured figures, and send-ahead depth."""

from __future__ import annotations

import pytest

from edgespec.edge.planner import Path, Planner


def one_block() -> Planner:
    """A planner for a client that keeps one block in flight, as ``speculating``'s rounds are
    (each pays the round trip): the figures below are priced that way."""
    planner = Planner()
    planner.use_send_ahead(1)
    return planner


def speculating(planner: Planner, *, rtt: float, forward: float, tokens: int, rounds: int = 8, device: float = 2.0,
                k: int | None = None):
    """Rounds of ``k`` drafts (default: tokens - 1, every draft accepted) committing ``tokens``."""
    for _ in range(rounds):
        planner.record_round(wall_ms=rtt + forward + device, wait_ms=rtt + forward, forward_ms=forward, tokens=tokens,
                             k=k or max(tokens - 1, 1))


def test_nothing_measured_means_speculate_and_learn():
    assert Planner().first_path(128) is Path.SPECULATIVE
    assert Planner("cloud_only").first_path(128) is Path.CLOUD_ONLY
    assert Planner("speculative").first_path(128) is Path.SPECULATIVE


def test_a_satellite_round_trip_starts_cloud_only_a_lan_one_speculates():
    far, near = Planner(), Planner()
    for planner, rtt in ((far, 640.0), (near, 1.0)):
        planner.record_rtt(rtt)
        planner.record_forward(15.0)
    assert far.first_path(128) is Path.CLOUD_ONLY
    assert near.first_path(128) is Path.SPECULATIVE


def test_speculation_is_left_when_it_measures_slower_than_cloud_only():
    planner = one_block()
    planner.begin(Path.SPECULATIVE)
    speculating(planner, rtt=200.0, forward=15.0, tokens=3, rounds=1, k=4)
    assert not planner.should_switch(Path.SPECULATIVE, 100)  # the first round rode with the Open
    speculating(planner, rtt=200.0, forward=15.0, tokens=3, rounds=1, k=4)
    # Beating a 16 ms stream over a 200 ms round trip takes ~14 tokens a round, a per-position
    # acceptance of 0.97: two rounds that accepted 2 of 4 rule it out.
    assert planner.break_even() > 0.95 and planner.unpromising()
    assert planner.should_switch(Path.SPECULATIVE, 100)
    assert planner.switch_log[-1].reason.startswith("unpromising")
    assert not planner.should_switch(Path.SPECULATIVE, 3)  # nothing left to gain


def test_a_fair_draft_is_left_on_its_measured_rate():
    """A draft with a fair chance to win that measures slower, round after round."""
    planner = one_block()
    planner.record_decode(15.0)
    planner.begin(Path.SPECULATIVE)
    speculating(planner, rtt=40.0, forward=15.0, tokens=3, rounds=3, k=4)  # 19 ms/token
    assert not planner.unpromising() and not planner.should_switch(Path.SPECULATIVE, 100)  # too few rounds
    speculating(planner, rtt=40.0, forward=15.0, tokens=3, rounds=5, k=4)
    assert planner.should_switch(Path.SPECULATIVE, 100)


def test_cloud_only_is_left_when_the_link_gets_fast_again():
    planner = one_block()
    speculating(planner, rtt=5.0, forward=15.0, tokens=5)
    speculating(planner, rtt=300.0, forward=15.0, tokens=5)  # the link got slow
    planner.begin(Path.CLOUD_ONLY)
    planner.record_cloud_rate(16.0 * 20, 20)  # the stream: 16 ms a token
    assert not planner.should_switch(Path.CLOUD_ONLY, 200)  # no round-trip probe in this segment yet
    planner.record_rtt(300.0)
    assert not planner.should_switch(Path.CLOUD_ONLY, 200)  # slow link: stay
    for _ in range(2):
        planner.record_rtt(4.0)
    assert not planner.should_switch(Path.CLOUD_ONLY, 200)  # two good probes in a window of slow ones are no trend
    planner.record_rtt(4.0)
    assert planner.should_switch(Path.CLOUD_ONLY, 200)  # three of five: the median is 4 ms, and 16 tokens a round win
    switch = planner.switch_log[-1]
    assert (switch.from_path, switch.to_path) == ("cloud_only", "speculative")
    assert switch.predicted_spec_ms_per_token < 16.0 == switch.predicted_cloud_ms_per_token


def streamed(planner: Planner, waits: list[float], *, trimmed: bool = True, hit_every: int = 50) -> int | None:
    """A Generate stream on a 600 ms satellite link, as the driver reports it: one token a
    message after waits of ``waits`` ms, the shadow right but every ``hit_every``-th draft; the
    token at which the planner leaves it (None: it stays). ``trimmed=False``: the stream's rate as
    it was measured before, every message counted whole."""
    planner.begin(planner.first_path(128))
    planner.record_first_token(700.0)
    planner.record_rtt(600.0)  # the segment's round-trip probe
    ms, slowest = 0.0, (0.0, 0, 0)
    for tokens, wait in enumerate(waits, 1):
        ms, slowest = ms + wait, max(slowest, (wait, 1, tokens))
        planner.record_cloud_rate(ms, tokens, messages=tokens if trimmed else 0, slowest=slowest)
        if planner.shadow_wanted(1):
            planner.record_shadow([tokens % hit_every != 0], 8)
        if planner.should_switch(Path.CLOUD_ONLY, 128 - tokens):
            return tokens
    return None


@pytest.mark.parametrize("trimmed", [True, False])
def test_a_loss_stall_early_in_a_stream_does_not_send_it_to_speculate(trimmed):
    """A satellite stream runs at 26 ms a token on a loaded replica (25 ms a step); speculation
    over its 600 ms round trip, even with a draft right 49 times in 50, costs ~39. One lost
    packet stalls the stream 850 ms at its sixth token, and the 33 tokens the replica made
    meanwhile come in a burst behind it. Counted whole, the stream's rate at the burst's start
    is 163 ms a token and still 75 at token 13, under the early-stall guard (3x the step) and
    past the forecast: the planner switched to the path 2.4x slower (bench planner, satellite,
    loaded). The stall is left out until the burst has come; after, the whole rate counts again,
    burst and all."""
    planner = on_link(rtt=600.0, forward=25.0, decode=25.0)
    planner.use_send_ahead(1)
    for _ in range(3):  # earlier requests: the shadow learned the draft is good, the stream is steady
        assert streamed(planner, [26.0] * 127) is None
    stall = [26.0] * 5 + [850.0] + [0.1] * 33 + [26.0] * 60  # the burst: delivered at once
    left = streamed(planner, stall, trimmed=trimmed)
    if trimmed:
        assert left is None
        assert planner.cloud_ms_per_token() == pytest.approx(sum(stall) / len(stall), rel=0.05)  # caught up: whole
    else:  # the measurement before: the scenario is the one that failed
        assert left is not None and left <= 13 and planner.switch_log[-1].predicted_cloud_ms_per_token > 75.0


def test_a_stream_that_stays_slow_after_a_stall_counts_the_stall():
    """A stall the stream never catches up on (no burst behind it: the replica itself paused) is
    left out only for as long as it would take to catch up; then it counts."""
    planner = on_link(rtt=600.0, forward=25.0, decode=14.0)
    waits, ms, slowest, rates = [16.0] * 5 + [850.0] + [16.0] * 60, 0.0, (0.0, 0, 0), []
    for tokens, wait in enumerate(waits, 1):
        ms, slowest = ms + wait, max(slowest, (wait, 1, tokens))
        planner.record_cloud_rate(ms, tokens, messages=tokens, slowest=slowest)
        rates.append(planner.est.cloud_ms_per_token)
    assert rates[5] == pytest.approx(16.0)  # the stall's message: left out
    assert rates[-1] == pytest.approx(ms / len(waits))  # 850 ms at 16 a token: 54 tokens on, it counts


def test_fixed_modes_never_switch():
    planner = Planner("speculative")
    speculating(planner, rtt=500.0, forward=15.0, tokens=2)
    assert not planner.should_switch(Path.SPECULATIVE, 1000)


def test_depth_covers_the_round_trip_and_drops_to_one_when_ahead_blocks_fail():
    planner = Planner(max_depth=4)
    assert planner.depth() == 2  # before any figure
    planner.record_rtt(60.0)
    planner.record_forward(20.0)
    assert planner.depth() == 4
    for _ in range(20):
        planner.record_ahead(False)
    assert planner.depth() == 1
    near = Planner()
    near.record_rtt(1.0)
    near.record_forward(20.0)
    assert near.depth() == 1  # a held block would save about the round trip: less than drafting it costs


def test_a_quarter_of_blocks_sent_ahead_holding_keeps_them_going_on_a_far_link():
    """bench on 4G (demo pair): a quarter of the blocks sent ahead held, and two in flight ran at
    12.5 ms/token against one's 14.1. The rule before (depth 1 below 15% held, the share taken
    from the first block on) sent none after the first few discards: 14.0. What a held block
    saves (most of a round trip) is weighed against what drafting it costs the device."""
    far, five_g = Planner(), Planner()
    for planner, rtt in ((far, 61.0), (five_g, 33.0)):
        planner.record_rtt(rtt)
        planner.record_forward(15.0)
        speculating(planner, rtt=rtt, forward=15.0, tokens=8, rounds=6, device=3.5, k=16)
        for held in [False, False, True, False] * 6:  # a quarter held, the first ones discarded
            planner.record_ahead(held)
            assert planner.depth() > 1, (rtt, planner.ahead_share())
    for _ in range(40):
        far.record_ahead(False)
    assert far.depth() == 1  # none held over a hard passage's forty rounds: no more sending ahead


def test_failed_send_ahead_is_retried_after_a_while():
    planner = Planner()
    planner.record_rtt(60.0)
    planner.record_forward(20.0)
    for _ in range(20):
        planner.record_ahead(False)
    assert planner.depth() == 1
    speculating(planner, rtt=60.0, forward=20.0, tokens=3, rounds=60)
    assert planner.depth() > 1


def test_sending_ahead_makes_speculation_cheaper_in_the_prediction_from_the_first_round():
    lone, chained = Planner(), Planner()
    for planner in (lone, chained):
        planner.record_rtt(60.0)
        planner.record_forward(15.0)
    lone.use_send_ahead(1)  # one block in flight: every round pays the round trip
    fresh = lone.predicted_speculative()
    assert chained.predicted_speculative() < fresh  # "auto", before any block went ahead
    two = Planner()
    two.record_rtt(60.0)
    two.record_forward(15.0)
    two.use_send_ahead(2)
    assert chained.predicted_speculative() <= two.predicted_speculative() < fresh
    for _ in range(10):
        chained.record_ahead(False)  # blocks sent ahead nearly always discarded: no more sending ahead
    assert chained.depth() == 1 and chained.predicted_speculative() == pytest.approx(fresh)


def test_bad_settings():
    with pytest.raises(ValueError, match="mode"):
        Planner("sometimes")
    with pytest.raises(ValueError, match="margin"):
        Planner(margin=1.5)


def test_tokens_the_draft_predicted_on_a_stream_replay_as_rounds():
    planner = Planner()
    planner.begin(Path.CLOUD_ONLY)
    # k=3: hit hit miss | hit hit hit (bonus) | miss | hit
    planner.record_shadow([True, True, False, True, True, True, False, False], 3)
    assert [tokens for tokens, _ in planner.est.tokens_per_round.samples] == [3, 4, 1]
    planner.record_shadow([True], 3)  # the run carries across chunks: nothing ends yet
    assert len(planner.est.tokens_per_round) == 3


def test_a_stream_the_draft_predicts_well_brings_speculation_back():
    planner = Planner()
    speculating(planner, rtt=20.0, forward=15.0, tokens=2)  # hard text: 18.5 ms/token
    planner.begin(Path.CLOUD_ONLY)
    planner.record_cloud_rate(12.0 * 20, 20)  # the stream: 12 ms a token
    planner.record_rtt(20.0)
    assert not planner.should_switch(Path.CLOUD_ONLY, 200)  # what was measured says: stay
    planner.record_shadow([True] * 8 * 9, 8)  # the draft now predicts every token
    assert planner.should_switch(Path.CLOUD_ONLY, 200)  # (20 + 15 + 2) / 9 = 4.1 ms/token
    assert planner.first_path(200) is Path.SPECULATIVE  # and the next generation starts there


def test_an_easy_text_after_a_hard_one_is_entered_on_the_streams_own_rounds():
    """A hard text's 64 short rounds fill the rounds acceptance by position is kept over: after
    108 streamed tokens the draft predicted perfectly, the forecast over every round kept still
    says 13 ms/token against the stream's 12. The stream's own replayed rounds say 2.3: once
    they rest on ENTER_DRAFTS drafts and the chance to win holds, speculation comes back."""
    def after(shadow_rounds: int) -> Planner:
        planner = one_block()
        planner.record_rtt(20.0)
        planner.record_forward(15.0)
        planner.first_path(200)
        planner.begin(Path.SPECULATIVE)
        for _ in range(64):  # the hard text: nothing of a block of 4 accepted
            planner.record_round(wall_ms=37.0, wait_ms=35.0, forward_ms=15.0, tokens=1, k=4)
        planner.begin(Path.CLOUD_ONLY)
        planner.record_cloud_rate(12.0 * 20, 20)
        planner.record_rtt(20.0)
        planner.record_shadow([True] * 9 * shadow_rounds, 8)  # the next text: every draft right
        return planner

    late = after(12)
    assert late.predicted_speculative() > late.cloud_ms_per_token() > 5 * late.segment_forecast()
    assert late.should_switch(Path.CLOUD_ONLY, 200)
    assert late.switch_log[-1].reason == "speculation predicted faster on this stream's text"
    assert not after(3).should_switch(Path.CLOUD_ONLY, 200)  # 27 drafts observed: not yet
    assert after(6).should_switch(Path.CLOUD_ONLY, 200)


def test_a_switch_must_repay_its_cost():
    planner = one_block()
    planner.record_forward(15.0)
    planner.record_rtt(60.0)
    planner.begin(Path.SPECULATIVE)
    # The Open's round carries the replica's prefill (30 ms beyond a round trip and a forward):
    # what a switch pays again.
    planner.record_round(wall_ms=110.0, wait_ms=105.0, forward_ms=15.0, tokens=4, k=6)
    speculating(planner, rtt=60.0, forward=15.0, tokens=4, rounds=7, k=6)  # 19.25 ms/token: 3 of 6 accepted
    planner.record_cloud_rate(15.0 * 20, 20)
    assert planner.switch_cost_ms() == pytest.approx(60.0 + 30.0, rel=0.05)
    assert planner.should_switch(Path.SPECULATIVE, 100)  # 100 x 4.25 ms gained
    assert not planner.should_switch(Path.SPECULATIVE, 30)  # 30 x 4.25 = 128 ms < 2 x 90


def test_predictions_learn_how_far_the_measurement_was_from_them():
    planner = one_block()
    planner.begin(Path.SPECULATIVE)
    planner.record_round(wall_ms=900.0, wait_ms=880.0, forward_ms=15.0, tokens=4, k=3)  # the Open's round: not the rate
    for rtt in (20.0, 20.0, 120.0, 20.0, 20.0, 20.0, 20.0, 20.0):  # one loss stall: trimmed, the median misses it
        planner.record_round(wall_ms=rtt + 15.0 + 2.0, wait_ms=rtt + 15.0, forward_ms=15.0, tokens=4, k=3)
    assert planner.est.rtt_ms.value == 20.0 and planner.est.spec_bias == pytest.approx(1.0)
    assert planner.est.spec.trimmed == pytest.approx(37.0 / 4)
    for rtt in (120.0, 20.0, 20.0, 120.0, 20.0, 120.0):  # stalls are frequent now: the prediction learns them
        planner.record_round(wall_ms=rtt + 15.0 + 2.0, wait_ms=rtt + 15.0, forward_ms=15.0, tokens=4, k=3)
    assert planner.est.rtt_ms.value == 20.0  # three of the last five round trips were fast...
    assert planner.est.spec_bias > 1.3  # ...but the rounds measured slower than predicted: the bias says so
    assert planner.predicted_speculative() == pytest.approx(planner.est.spec_bias * planner.predicted_speculative(corrected=False))


def speculating_on_4g() -> Planner:
    """A planner that sends blocks ahead (``"auto"``) over a 4G round trip, its request begun
    on a speculative segment."""
    planner = Planner()
    planner.use_send_ahead("auto")
    planner.record_rtt(61.0)
    planner.record_forward(8.0)
    planner.record_decode(7.5)
    planner.first_path(128)
    planner.begin(Path.SPECULATIVE)
    return planner


def test_the_bias_corrects_the_costs_not_the_acceptance():
    """A 4G device that sends blocks ahead: an easy text, then a hard one whose blocks go back
    and forth fresh (each waits for its verdict), every round costing exactly what the cost model
    says a fresh round does. The bias stays 1: whether blocks hold is the acceptance's to say, so
    the hard text leaves no bias that prices the next easy one dear (it had priced each round at
    the mix of a fresh and a held one, weighted by a chance to hold that the hard text belied:
    a bias of 1.32 here)."""
    planner = speculating_on_4g()
    k, forward = 8, 8.0

    def fresh_round(tokens: int) -> None:
        device = planner.device_ms(k)
        planner.record_round(wall_ms=61.0 + forward + device, wait_ms=61.0 + forward, forward_ms=forward, tokens=tokens, k=k)

    fresh_round(k + 1)  # (the Open's round)
    for _ in range(6):
        fresh_round(k + 1)  # easy: every draft accepted
    assert planner.depth() > 1 and planner._tokens_and_holds()[1][k] > 0.3  # blocks sent ahead would hold
    for _ in range(12):
        fresh_round(1)  # hard: the first draft rejected
    assert planner.est.spec_bias == pytest.approx(1.0, abs=0.02)


def test_blocks_discarded_in_a_hard_passage_do_not_price_the_next_segment():
    """Blocks sent ahead in a hard passage are discarded (depth 1 for the rest of it); once it
    is left, the stream prices speculation with blocks in flight again, whether they hold being
    what the acceptance observed over the stream says (on 4G, priced at depth 1, an easy text
    after hard ones was predicted at 11.5 ms/token against the stream's 8.8 at its 64th
    streamed token, and the always-speculating arms ran it at 4.5-6.4)."""
    planner = speculating_on_4g()
    for _ in range(6):
        planner.record_ahead(False)
    assert planner.depth() == 1
    dear = planner.predicted_speculative()
    planner.begin(Path.CLOUD_ONLY)
    assert planner.depth() > 1 and planner.predicted_speculative() < dear


def test_send_ahead_cannot_hide_more_than_depth_blocks_per_round_trip():
    """A satellite link with blocks that chain well: no more than ``depth`` of them travel per
    round trip, so speculation still loses to the stream and a generation starts cloud-only."""
    planner = Planner()
    planner.record_rtt(630.0)
    planner.record_forward(20.0)
    planner.record_decode(15.0)
    for _ in range(20):
        planner.record_ahead(True)
    speculating(planner, rtt=630.0, forward=20.0, tokens=9, rounds=9)
    assert planner.predicted_round_ms() >= 630.0 / planner.depth()
    assert planner.first_path(128) is Path.CLOUD_ONLY


def test_an_unmeasured_stream_is_priced_at_what_the_replica_measured_of_its_streams():
    """Before this device has streamed, the stream costs what the replica's own streams took per
    token (Info.stream_ms: the step plus scheduling and sending), never less than the step and a
    message; a stream the device measured replaces both. A slower stream lowers the acceptance
    speculation needs to win."""
    plain, told = on_link(), on_link()
    told.record_decode(14.0, stream_ms=24.0)
    assert plain.stream_ms_per_token() == 15.0 and told.stream_ms_per_token() == 24.0
    assert told.break_even() < plain.break_even()
    quick = on_link()
    quick.record_decode(14.0, stream_ms=9.0)  # (a replica's figure under the step: from lighter moments)
    assert quick.stream_ms_per_token() == 15.0
    told.record_cloud_rate(200.0, 10)
    assert told.stream_ms_per_token() == 20.0


def test_a_round_trip_no_draft_could_beat_is_left_after_two_rounds():
    planner = one_block()
    planner.record_decode(15.0)
    assert planner.first_path(128) is Path.SPECULATIVE  # the round trip is not known yet
    planner.begin(Path.SPECULATIVE)
    speculating(planner, rtt=630.0, forward=20.0, tokens=9, rounds=1)
    assert not planner.should_switch(Path.SPECULATIVE, 100)  # the first round carried the Open
    speculating(planner, rtt=630.0, forward=20.0, tokens=9, rounds=1)
    assert planner.hopeless() and planner.should_switch(Path.SPECULATIVE, 100)
    near = one_block()
    near.record_decode(15.0)
    near.first_path(128)
    near.begin(Path.SPECULATIVE)
    speculating(near, rtt=40.0, forward=20.0, tokens=2, rounds=2)
    assert not near.hopeless() and not near.should_switch(Path.SPECULATIVE, 100)


# ---- a draft that cannot win, and one that started badly -------------------------------------
# Figures of one link: a 20 ms round trip, a 15 ms verify forward, 2 ms on the device, a 14 ms
# decoding step (15 ms a streamed token). A round costs 37 ms = 2.5 streamed tokens, so
# speculation wins once a round commits more than 2.5 tokens: a* = 0.59 per position at max_k.

HOPELESS = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]  # accepted drafts of 4: ~0.03 a position
GOOD = [0, 3, 2, 4, 4, 1, 3, 4, 2, 4, 3, 4, 1, 4, 3, 4]  # ~0.7 a position, the first round unlucky


def on_link(rtt: float = 20.0, forward: float = 15.0, decode: float = 14.0) -> Planner:
    """A planner as the client makes one: the server's step times and one probed round trip."""
    planner = Planner()
    planner.record_rtt(rtt)
    planner.record_forward(forward)
    planner.record_decode(decode)
    return planner


def verified(planner: Planner, accepted: int, *, k: int = 4, rtt: float = 20.0, forward: float = 15.0) -> None:
    planner.record_round(wall_ms=rtt + forward + 2.0, wait_ms=rtt + forward, forward_ms=forward,
                         tokens=accepted + 1, k=k)


def rounds_until_left(planner: Planner, accepted: list[int], *, max_new_tokens: int = 128,
                      rtt: float = 20.0) -> int | None:
    """The round after which the planner leaves speculation (None: it stays)."""
    planner.begin(planner.first_path(max_new_tokens))
    generated = 0
    for i, n in enumerate(accepted, 1):
        verified(planner, n, rtt=rtt)
        generated += n + 1
        if planner.should_switch(Path.SPECULATIVE, max_new_tokens - generated):
            return i
    return None


def test_a_hopeless_draft_is_left_within_three_rounds_where_a_good_one_wins():
    good, hopeless = on_link(), on_link()
    assert rounds_until_left(good, GOOD) is None  # a link where a good draft wins...
    assert good.est.spec.trimmed * (1 + good.margin) < good.cloud_ms_per_token()
    left = rounds_until_left(hopeless, HOPELESS)  # ...and one that never agrees is left at once
    assert left is not None and left <= 3
    assert hopeless.chance_to_win() < Planner.WIN_CHANCE <= good.chance_to_win()
    assert hopeless.first_path(128) is Path.CLOUD_ONLY  # and the next generation streams from the start


def test_one_unlucky_first_round_does_not_condemn_a_good_draft():
    planner = on_link()
    planner.begin(planner.first_path(128))
    verified(planner, 0)  # nothing accepted, true acceptance ~0.7 (tau ~2.8 at k=4)
    assert planner.chance_to_win() > Planner.WIN_CHANCE  # one failure: P(a >= 0.59) = 0.13
    verified(planner, 1)
    assert not planner.should_switch(Path.SPECULATIVE, 120)
    assert rounds_until_left(on_link(), GOOD) is None


@pytest.mark.parametrize("rtt", [1.0, 5.0, 20.0])
def test_a_hopeless_draft_costs_a_first_request_under_five_percent(rtt):
    """The loss against streaming from the start: the first round costs what a stream's first
    token does (its block rides with the Open), each later round its time less what its tokens
    would have cost streamed, and the switch a round trip and the replica's prefill. The faster
    the link, the more rounds it takes (a* is lower) and the less each one loses."""
    planner = on_link(rtt=rtt)
    cloud, round_ms = planner.cloud_ms_per_token(), rtt + 15.0 + 2.0
    left = rounds_until_left(planner, HOPELESS, rtt=rtt)
    assert left is not None
    lost = sum(round_ms - (n + 1) * cloud for n in HOPELESS[1:left]) + planner.switch_cost_ms()
    assert lost <= 0.05 * 128 * cloud, (left, lost)


def test_an_unpromising_draft_rests_over_the_stream_and_comes_back_when_it_turns_good():
    planner = on_link()
    assert rounds_until_left(planner, HOPELESS) is not None
    planner.begin(Path.CLOUD_ONLY)
    planner.record_cloud_rate(15.0 * 20, 20)
    planner.record_rtt(20.0)
    run_over = 0

    def stream(tokens: int, hit) -> int | None:
        """One token at a time, as Shadow.observe sees the stream; the token that brings
        speculation back, if one does."""
        nonlocal run_over
        for i in range(tokens):
            if planner.shadow_wanted(1):
                run_over += 1
                planner.record_shadow([hit(i)], 4)
            if planner.should_switch(Path.CLOUD_ONLY, 1000):
                return i
        return None

    assert stream(1024, lambda i: i % 32 == 0) is None  # still hopeless: it looks now and then
    assert 0 < run_over <= 1024 * Planner.SHADOW_LOOK / Planner.SHADOW_PERIOD  # 1/16 of the stream
    back = stream(1024, lambda i: i % 5 != 4)  # the text turned easy: 0.8 a position
    assert back is not None and back <= Planner.SHADOW_PERIOD + 64  # at the next look, and soon after
    assert planner.first_path(128) is Path.SPECULATIVE


def test_one_slow_forward_does_not_price_speculation_out_for_good():
    """bench planner on loopback with a busy process: the first request's second round measured
    the replica's forward at 220 ms (15 otherwise), the draft was "hopeless" and every later
    request streamed at 10-17 ms/token where speculation ran at 3-4: while streaming no round
    measures the forward again. The forward the replica reports, probed beside the stream,
    brings speculation back."""
    planner = Planner()
    planner.record_rtt(3.0)
    planner.record_forward(15.0)
    planner.record_decode(9.0, stream_ms=10.0)
    assert planner.first_path(128) is Path.SPECULATIVE
    planner.begin(Path.SPECULATIVE)
    speculating(planner, rtt=3.0, forward=220.0, tokens=9, rounds=2, k=16)
    assert planner.first_path(128) is Path.CLOUD_ONLY
    planner.begin(Path.CLOUD_ONLY)
    for _ in range(4):  # two seconds of a stream's probes
        planner.record_replica_forward(15.0)
    assert planner.first_path(128) is Path.SPECULATIVE, planner.switch_log


def test_a_stream_measured_on_a_busy_replica_does_not_price_every_later_request():
    """bench planner on 4G: the first text's stream, on a replica busy with other arms, measured
    20.6 ms/token, and k=auto priced cloud-only at that for the next five texts while their streams
    took 12.4-16.2: it kept speculating at 17-26 ms/token. The measured rate moves with the
    replica's own stream figure (probed beside every segment), by as much as that figure moved."""
    planner = Planner()
    planner.record_rtt(63.0)
    planner.record_forward(15.0)
    planner.record_decode(18.0, stream_ms=20.0)  # the replica busy
    planner.begin(planner.first_path(128))
    speculating(planner, rtt=63.0, forward=15.0, tokens=5, rounds=8, k=8)  # 16 ms/token
    planner.begin(Path.CLOUD_ONLY)
    planner.record_cloud_rate(20.6 * 25, 25, messages=25)
    assert planner.stream_ms_per_token() == pytest.approx(20.6)
    assert planner.first_path(128) is Path.SPECULATIVE  # 16 against 20.6: right while the replica is busy
    planner.record_decode(9.0, stream_ms=10.0)  # ...and idle again
    assert planner.stream_ms_per_token() == pytest.approx(10.6)  # the link's 0.6 ms/token over the replica's stays
    assert planner.first_path(128) is Path.CLOUD_ONLY
    planner.record_decode(18.0, stream_ms=20.0)
    assert planner.first_path(128) is Path.SPECULATIVE
    planner.record_decode(2.0, stream_ms=3.0)  # a replica figure far below the basis: never under its decoding step
    assert planner.stream_ms_per_token() == pytest.approx(3.6)
    planner.record_cloud_rate(4.0 * 30, 30, messages=30)  # a new stream measures beside the new figure
    assert planner.stream_ms_per_token() == pytest.approx(4.0)


def test_the_shadow_runs_on_the_share_its_price_assumes():
    """Cloud-only's price counts the shadow at its share of the stream (``shadow_share`` at
    ``stream_ms_per_token``), and the shadow's looks are spaced by ``shadow_share()`` (asked with
    no rate, by ``shadow_wanted``): both read the same stream rate. Once the replica's figure had
    moved (busy, then idle), the share read the rate measured while it was busy, so the shadow
    ran on twice the share its price assumed."""
    planner = Planner()
    planner.record_rtt(63.0)
    planner.record_forward(15.0)
    planner.record_decode(18.0, stream_ms=20.0)  # the replica busy
    planner.first_path(128)
    planner.begin(Path.CLOUD_ONLY)
    planner.record_cloud_rate(20.6 * 25, 25, messages=25)
    planner.record_shadow([True] * 64, draft_ms=64 * 1.0)  # the draft: 1 ms a streamed token, 64 drafts observed
    planner.record_decode(9.0, stream_ms=10.0)  # ...and idle again
    stream = planner.stream_ms_per_token()
    assert stream == pytest.approx(10.6)
    assert planner.shadow_share() == pytest.approx(Planner.SHADOW_SHARE * stream / 1.0)
    assert planner.cloud_ms_per_token() == pytest.approx(stream + planner.shadow_share() * 1.0)
