"""The simulator check's calibration: the replica's batch curve, the ingress split, per-link fixed cost."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from edgespec.cloud.bench.calibrate import (
    calibrate,
    decode_steps,
    link_round_overhead,
    link_round_trip_ms,
    load_scaled_cells,
    split_round_ingress,
    split_stream_ingress,
    verify_table,
)
from edgespec.cloud.link.profiles import PROFILES, LinkProfile
from edgespec.cloud.simulate import SPECULATIVE, Calibration, FleetConfig, VerifyModel, simulate_path


def test_batch_curve_table_holds_the_measured_cells_and_derives_the_decode_column():
    cells = {(1, 2): 21.0, (1, 5): 21.5, (16, 2): 120.0, (16, 5): 140.0}
    table = verify_table(cells, {1: 20.0})
    assert table.tokens_per_row == (1, 2, 5) and table.batch == (1, 16)
    assert table(1, 1) == pytest.approx(20.0)  # the replica's own lone decode step
    assert table(16, 1) == pytest.approx(119.0)  # the 2-token column less the gap at batch 1
    assert table(16, 5) == pytest.approx(140.0) and table(1, 2) == pytest.approx(21.0)
    assert verify_table(cells)(1, 2) == 21.0 and verify_table(cells).tokens_per_row == (2, 5)
    # With the batched decode step measured too, the column runs through both.
    both = verify_table({**cells, (8, 2): 60.0, (8, 5): 70.0}, {1: 20.0, 16: 90.0})
    assert both(16, 1) == pytest.approx(90.0) and both(8, 1) == pytest.approx(20.0 + 70.0 * 7 / 15)


def test_decode_steps_are_the_median_forward_by_batch_from_stream_replies():
    # Each forward shows up once per stream in it: 4 lone forwards, 3 forwards of 16 rows.
    lone = [(1, 20.0), (1, 21.0), (1, 19.0), (1, 40.0)]
    burst = [(16, ms) for ms in (100.0, 110.0, 105.0) for _ in range(16)]
    ramp = [(15, 99.0)] * 15 + [(0, 0.0)] * 5  # one forward of 15 (too few), replies of an older replica
    steps = decode_steps(lone + burst + ramp)
    assert steps == {1: pytest.approx(20.5), 16: pytest.approx(105.0)}
    assert decode_steps(ramp, min_forwards=1) == {15: 99.0}
    assert decode_steps([]) == {}


def test_link_round_trip_is_the_profiles_own_delay():
    assert link_round_trip_ms(PROFILES["loopback"], 40, 30) == 0.0
    fixed = LinkProfile("fixed", rtt_ms=20.0, bandwidth_up_mbit=8.0, bandwidth_down_mbit=8.0)
    # 20 ms there and back, plus 40 + 30 bytes at 8 Mbit/s (1 byte per microsecond).
    assert link_round_trip_ms(fixed, 40, 30) == pytest.approx(20.0 + 0.07)
    wifi = PROFILES["wifi"]
    assert wifi.rtt_ms < link_round_trip_ms(wifi, 40, 30) < wifi.rtt_ms + 2 * wifi.jitter_ms


def test_link_fixed_cost_is_what_the_link_adds_beyond_its_model():
    fixed = LinkProfile("fixed", rtt_ms=20.0)
    assert link_round_overhead(25.5, 3.0, fixed, 40, 30) == pytest.approx(2.5)
    assert link_round_overhead(21.0, 3.0, fixed, 40, 30) == 0.0  # never negative


def test_link_fixed_cost_is_paid_once_per_round_on_that_link_only():
    base = Calibration(source="t", draft_ms_per_token=0.1, draft_cv=0.0, acceptance=(1.0,),
                       verify=VerifyModel(a_ms=1.0, b_ms=0.0, c_ms=0.0), ingress_ms_per_round_message=0.0,
                       ingress_ms_per_stream_message=0.0, prefill_ms=0.0)
    costly = Calibration(**{**base.__dict__, "round_overhead_by_link_ms": {"loopback": 2.0}})
    config = FleetConfig(devices=1, link_mix="loopback", k=4, tokens_per_device=500)
    plain, paid = simulate_path(config, base), simulate_path(config, costly)
    assert paid.rounds == plain.rounds == 100
    assert (paid.mean_ms_per_token - plain.mean_ms_per_token) * 500 == pytest.approx(100 * 2.0)
    elsewhere = simulate_path(FleetConfig(devices=1, link_mix="lan", k=4, tokens_per_device=500, seed=1),
                              Calibration(**{**base.__dict__, "round_overhead_by_link_ms": {"wifi": 2.0}}))
    assert elsewhere.mean_ms_per_token == pytest.approx(
        simulate_path(FleetConfig(devices=1, link_mix="lan", k=4, tokens_per_device=500, seed=1), base).mean_ms_per_token)
    assert costly.round_overhead_for("loopback") == 2.0 and costly.round_overhead_for("wifi") == 0.0


def test_link_fixed_costs_round_trip_through_json_and_are_validated(tmp_path):
    calibration = Calibration(round_overhead_by_link_ms={"wifi": 1.5, "4g": 0.5})
    calibration.save(tmp_path / "c.json")
    assert Calibration.load(tmp_path / "c.json") == calibration
    assert json.loads((tmp_path / "c.json").read_text())["round_overhead_by_link_ms"] == {"wifi": 1.5, "4g": 0.5}
    with pytest.raises(ValueError, match="round_overhead_by_link_ms"):
        Calibration(round_overhead_by_link_ms={"wifi": -1.0})


def test_ingress_split_recovers_the_service_time_of_a_loaded_replica():
    verify = VerifyModel(a_ms=15.0, b_ms=1.0, c_ms=0.3)
    overhead, service = 3.0, 0.9  # one session: 2 * 0.9 queues, 1.2 is latency

    def loaded_round_ms(s):
        calibration = Calibration(source="t", draft_ms_per_token=1e-3, draft_cv=0.0, acceptance=(0.0,), verify=verify,
                                  ingress_ms_per_round_message=s, round_overhead_ms=overhead - 2 * s, prefill_ms=0.0)
        config = FleetConfig(devices=16, link_mix="loopback", k=4, tokens_per_device=60, max_batch_size=16)
        return simulate_path(config, calibration, SPECULATIVE).mean_ms_per_token

    loaded = {"sessions": 16, "k": 4, "round_ms_mean": loaded_round_ms(service)}
    found = split_round_ingress(verify, overhead, loaded, batch_wait_ms=5.0)
    assert found == pytest.approx(service, abs=overhead / 2 / 40)  # the grid's step
    # The steady rounds are what it matches (the first rounds wait for every session's prefill).
    opening = {**loaded, "round_ms_mean": loaded["round_ms_mean"] + 30.0, "round_ms_steady_mean": loaded["round_ms_mean"]}
    assert split_round_ingress(verify, overhead, opening, batch_wait_ms=5.0) == found
    assert split_round_ingress(verify, overhead, {**loaded, "round_ms_mean": 1e6}, 5.0) == overhead / 2


def test_stream_ingress_split_reads_service_and_latency_off_reply_gaps_less_their_steps():
    # The model: a reply every step(b) + L + b * s. L = 0.5, s = 0.3; the steps drift with load.
    lone = [(1, step, step + 0.5 + 0.3) for step in (18.0, 22.0, 20.0, 30.0)]
    burst = [(16, step, step + 0.5 + 16 * 0.3) for step in (90.0, 120.0, 105.0) for _ in range(16)]
    ramp = [(3, 40.0, 90.0)] * 3  # the burst's ramp-up: too few replies to be its batch
    message_ms, latency_ms = split_stream_ingress(lone + burst + ramp)
    assert message_ms == pytest.approx(0.3) and latency_ms == pytest.approx(0.5)
    assert split_stream_ingress(lone) == (0.0, pytest.approx(0.8))  # alone: all of it is latency
    # Noise that makes the loaded excess smaller than the lone one: no negative service time.
    assert split_stream_ingress([(1, 20.0, 25.0), (16, 100.0, 103.0)]) == (0.0, 5.0)
    with pytest.raises(ValueError, match="lone stream"):
        split_stream_ingress(burst)


def test_batch_curve_is_carried_to_the_load_the_decode_steps_read_now():
    cells = {(1, 5): 26.0, (8, 5): 74.0, (16, 5): 150.0}
    scaled = load_scaled_cells(cells, {1: 20.0, 16: 125.0}, {1: 18.0, 16: 100.0})
    assert scaled[(1, 5)] == pytest.approx(26.0 * 0.9) and scaled[(16, 5)] == pytest.approx(150.0 * 0.8)
    assert scaled[(8, 5)] == pytest.approx(74.0 * (0.9 + (0.8 - 0.9) * 7 / 15))
    assert load_scaled_cells(cells, {1: 20.0}, {16: 100.0}) == cells  # nothing in common: unchanged
    assert load_scaled_cells(cells, {1: 20.0, 16: 125.0}, {1: 10.0})[(16, 5)] == pytest.approx(75.0)  # flat past


def fake_harness(spec, cloud) -> SimpleNamespace:
    """What ``calibrate`` reads of a harness: the speculative run ``spec`` and the stream ``cloud``."""
    return SimpleNamespace(
        run=lambda prompts, params, label: [spec], cloud_only=lambda prompt, params: cloud,
        client=SimpleNamespace(draft=SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids: "x" * len(ids)))),
        target="t", draft="d",
    )


def test_calibrate_splits_the_round_overhead_when_the_ingress_is_measured_under_load():
    from edgespec.edge.stats import RequestStats
    from edgespec.edge.types import Result, RoundRecord

    verify = VerifyModel(a_ms=2.0, b_ms=0.0, c_ms=0.5)  # verify(1, 5) = 4.5, verify(1, 1) = 2.5
    rounds = [RoundRecord(4, (1, 2, 3, 4), 1, 9, draft_ms=2.0, wait_ms=4.5 + 8.0, batch_size=1) for _ in range(6)]
    spec = Result("", [1, 9] * 6, [5], "length", RequestStats(rounds=6, drafted=24, accepted=6, generated=12,
                                                                 wall_s=0.2, draft_s=0.012), rounds)
    # 33 tokens: the first at 20 ms, then one every 2.5 + 6 ms.
    cloud = Result("", [1] * 33, [5], "length", RequestStats(generated=33, wall_s=(20 + 32 * 8.5) / 1000, first_token_s=0.020))
    harness = fake_harness(spec, cloud)
    calibration = calibrate(harness, ["p"], verify, None, k=4, round_message_ms=1.5, progress=lambda line: None)
    assert calibration.ingress_ms_per_round_message == 1.5
    assert calibration.round_overhead_ms == pytest.approx(8.0 - 3.0)  # the rest of the round is latency
    # prefill: the first token (20 ms) less a steady one (8.5) less its message (6)
    assert calibration.prefill_ms == pytest.approx(20 - 8.5 - 6.0)


def test_calibrate_takes_each_round_against_the_forward_the_replica_reported_for_it():
    from edgespec.edge.stats import RequestStats
    from edgespec.edge.types import Result, RoundRecord

    verify = VerifyModel(a_ms=2.0, b_ms=0.0, c_ms=0.5)  # the table says verify(1, 5) = 4.5
    # The load moved: the replica reported 9 ms forwards; each round waited 9 + 2 x 1.5 + 2.
    rounds = [RoundRecord(4, (1, 2, 3, 4), 1, 9, draft_ms=2.0, wait_ms=9.0 + 5.0, batch_size=1, verify_ms=9.0) for _ in range(6)]
    spec = Result("", [1, 9] * 6, [5], "length", RequestStats(rounds=6, drafted=24, accepted=6, generated=12,
                                                                 wall_s=0.2, draft_s=0.012), rounds)
    cloud = Result("", [1] * 33, [5], "length", RequestStats(generated=33, wall_s=(20 + 32 * 8.5) / 1000, first_token_s=0.020))
    harness = fake_harness(spec, cloud)
    calibration = calibrate(harness, ["p"], verify, 50.0, k=4, round_message_ms=1.5, progress=lambda line: None)
    assert calibration.round_overhead_ms == pytest.approx(2.0)  # not 14 - 4.5 - 3: the table's moment is not the round's
    # With each round's wall (verdict to verdict) recorded, the client's own work between a
    # verdict and its next send counts too (1 ms here); the first round (the opening) is left out.
    walled = [RoundRecord(4, (1, 2, 3, 4), 1, 9, draft_ms=2.0, wait_ms=14.0, batch_size=1, verify_ms=9.0,
                          wall_ms=(500.0 if i == 0 else 2.0 + 14.0 + 1.0)) for i in range(6)]
    spec.rounds[:] = walled
    calibration = calibrate(harness, ["p"], verify, 50.0, k=4, round_message_ms=1.5, progress=lambda line: None)
    assert calibration.round_overhead_ms == pytest.approx(3.0)


def test_batch_curve_passes_take_each_cells_median(monkeypatch):
    from edgespec.cloud.bench import calibrate as module

    calls = []

    def fake_raw_rounds(address, fingerprint, vocab, k, rounds, sessions, prompt_len=32):
        calls.append((k, sessions))
        spike = 5.0 if len(calls) == 1 else 1.0  # a burst of load elsewhere during the first run only
        ms = spike * (10.0 + sessions * (k + 1))
        return {"sessions": sessions, "k": k, "verify_ms_by_batch": {sessions: (rounds, ms)}}

    monkeypatch.setattr(module, "raw_rounds", fake_raw_rounds)
    table, runs = module.replica_verify_model("a", "f", 100, ks=(1, 4), session_counts=(1, 4), passes=3, context=40)
    assert len(runs) == 12 and calls[:4] == [(1, 1), (1, 4), (4, 1), (4, 4)] and calls[4:8] == calls[:4][::-1]
    assert table(1, 2) == pytest.approx(12.0) and table(4, 5) == pytest.approx(30.0)  # the spike is outvoted
    assert runs[0]["cell_ms"] == pytest.approx(60.0)
