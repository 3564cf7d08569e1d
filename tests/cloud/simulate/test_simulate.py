"""The fleet simulator: determinism, closed forms in the limits, load behaviour, sweeps, CLI."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from edgespec.cloud.link.profiles import PROFILES, LinkProfile
from edgespec.cloud.simulate import (
    CLOUD_ONLY,
    SPECULATIVE,
    Calibration,
    FleetConfig,
    VerifyModel,
    optimal_k_vs_rtt,
    parse_link_mix,
    plot_capacity,
    plot_optimal_k,
    plot_speedup_vs_rtt,
    simulate,
    simulate_path,
    speedup_vs_rtt,
    capacity_vs_devices,
)

# No network cost at all: zero delay, unlimited bandwidth, no ingress, proxy or prefill cost.
ZERO_LINK = PROFILES["loopback"]


def free_network(**changes) -> Calibration:
    values = dict(
        source="test",
        draft_ms_per_token=0.1,
        draft_cv=0.0,
        acceptance=(0.8,),
        verify=VerifyModel(a_ms=1.0, b_ms=0.0, c_ms=0.0),
        ingress_ms_per_round_message=0.0,
        ingress_ms_per_stream_message=0.0,
        round_overhead_ms=0.0,
        stream_overhead_ms=0.0,
        prefill_ms=0.0,
    )
    values.update(changes)
    return Calibration(**values)


def closed_form_length(alpha: float, k: int) -> float:
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def length_variance(alpha: float, k: int) -> float:
    # P(L = j) = alpha^(j-1) (1 - alpha) for j <= k, P(L = k + 1) = alpha^k.
    probs = [alpha ** (j - 1) * (1 - alpha) for j in range(1, k + 1)] + [alpha**k]
    mean = sum(j * p for j, p in zip(range(1, k + 2), probs))
    return sum((j - mean) ** 2 * p for j, p in zip(range(1, k + 2), probs))


# ---- determinism --------------------------------------------------------------------------


def test_same_seed_same_result_and_different_seed_different_draws():
    config = FleetConfig(devices=12, link_mix="wifi:0.5,4g:0.5", replicas=2, k="auto", tokens_per_device=64, seed=7)
    first, second = simulate(config), simulate(config)
    assert first.to_dict() == second.to_dict()
    other = simulate(FleetConfig(devices=12, link_mix="wifi:0.5,4g:0.5", replicas=2, k="auto", tokens_per_device=64, seed=8))
    assert other.speculative.ms_per_token != first.speculative.ms_per_token


# ---- closed forms -------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_acceptance_length_matches_closed_form(alpha, k):
    calibration = free_network(acceptance=(alpha,))
    config = FleetConfig(devices=4, link_mix=ZERO_LINK, k=k, duration_s=2.0, seed=k)
    result = simulate_path(config, calibration, SPECULATIVE)
    assert result.rounds > 3000
    expected = closed_form_length(alpha, k)
    assert calibration.expected_acceptance_length(k) == pytest.approx(expected)
    standard_error = math.sqrt(length_variance(alpha, k) / result.rounds)
    assert abs(result.acceptance_length - expected) < 4 * standard_error + 1e-9


def test_cloud_only_single_device_costs_one_forward_plus_overhead_per_token():
    calibration = free_network(verify=VerifyModel(a_ms=7.0, b_ms=0.5, c_ms=0.25), stream_overhead_ms=1.5)
    config = FleetConfig(devices=1, link_mix=ZERO_LINK, tokens_per_device=400)
    result = simulate_path(config, calibration, CLOUD_ONLY)
    per_token = calibration.verify(1, 1) + calibration.stream_overhead_ms
    assert result.mean_ms_per_token == pytest.approx(per_token, rel=0.01)
    assert result.batch_sizes == {1: 400}


def test_speculative_single_device_round_time_in_the_free_limit():
    calibration = free_network(acceptance=(1.0,), verify=VerifyModel(a_ms=4.0, b_ms=0.0, c_ms=0.0))
    config = FleetConfig(devices=1, link_mix=ZERO_LINK, k=4, duration_s=1.0)
    result = simulate_path(config, calibration, SPECULATIVE)
    # Every draft accepted: 5 tokens per round of 4 * 0.1 ms drafting + 4 ms verifying.
    assert result.acceptance_length == 5.0
    assert result.mean_ms_per_token == pytest.approx(4.4 / 5, rel=0.01)


# ---- load ---------------------------------------------------------------------------------


def test_more_devices_than_a_replica_serves_slow_each_device_and_saturate_it():
    calibration = free_network(verify=VerifyModel(a_ms=2.0, b_ms=1.0, c_ms=0.2))
    runs = {}
    for devices in (1, 4, 64):
        config = FleetConfig(devices=devices, link_mix="lan", k=4, max_batch_size=8, duration_s=2.0)
        runs[devices] = simulate_path(config, calibration, SPECULATIVE)
    ms = [runs[n].mean_ms_per_token for n in (1, 4, 64)]
    assert ms[0] < ms[1] < ms[2]
    assert runs[1].mean_utilisation < 0.9
    assert runs[64].mean_utilisation > 0.98
    assert max(runs[64].batch_sizes) == 8  # the cap holds
    assert runs[64].capacity_tokens_per_s > runs[1].capacity_tokens_per_s


def test_replicas_split_the_load():
    calibration = free_network(verify=VerifyModel(a_ms=2.0, b_ms=1.0, c_ms=0.2))
    one = simulate_path(FleetConfig(devices=32, link_mix="lan", replicas=1, duration_s=1.0), calibration)
    four = simulate_path(FleetConfig(devices=32, link_mix="lan", replicas=4, duration_s=1.0), calibration)
    assert four.mean_ms_per_token < one.mean_ms_per_token
    assert len(four.utilisation) == 4


def test_optimal_k_grows_weakly_with_rtt():
    calibration = free_network(acceptance=(0.8,), draft_ms_per_token=1.0, verify=VerifyModel(a_ms=5.0, b_ms=0.0, c_ms=0.1))
    rows = optimal_k_vs_rtt([0, 20, 80, 300], ks=range(1, 13), calibration=calibration, tokens_per_device=3000)
    best = [row["best_k"] for row in rows]
    assert best == sorted(best), best
    assert best[-1] > best[0]


def test_rtt_hurts_speculation_more_than_the_pipelined_baseline():
    rows = speedup_vs_rtt([0, 200], k=4, tokens_per_device=200)
    assert rows[0]["speedup"] > rows[1]["speedup"]
    # The baseline pays the round trip once (request up, first token down), then pipelines.
    slower = rows[1]["cloud_only_ms_per_token"] - rows[0]["cloud_only_ms_per_token"]
    assert slower == pytest.approx(200 / 200, rel=0.01)


def test_draft_ahead_helps_when_acceptance_is_high_and_links_slow():
    calibration = free_network(acceptance=(0.95,), draft_ms_per_token=3.0)
    base = FleetConfig(devices=2, link_mix="4g", k=6, tokens_per_device=600)
    ahead = FleetConfig(devices=2, link_mix="4g", k=6, tokens_per_device=600, draft_ahead=True)
    assert simulate_path(ahead, calibration).mean_ms_per_token < simulate_path(base, calibration).mean_ms_per_token


def test_batch_wait_merges_cloud_only_convoys():
    # Two Generate streams that start out of phase: with batch_wait 0 the replica takes only
    # what queued during the previous forward, so they take turns on it for ever. The default
    # wait (5 ms, the server's) outlasts the 1 ms each stream needs to come back after its
    # forward, so the next batch waits for it. (Under the old policy, a wait counted from the
    # oldest queued row, this needed a wait longer than the phase gap: 25 ms.)
    calibration = free_network(verify=VerifyModel(a_ms=20.0, b_ms=0.5, c_ms=0.0), stream_overhead_ms=1.0)
    kwargs = dict(devices=2, link_mix="wifi", duration_s=5.0, max_batch_size=2)
    no_wait = simulate_path(FleetConfig(batch_wait_ms=0.0, **kwargs), calibration, CLOUD_ONLY)
    wait = simulate_path(FleetConfig(**kwargs), calibration, CLOUD_ONLY)
    assert no_wait.mean_batch_size == 1.0
    assert wait.mean_batch_size > 1.9
    assert wait.mean_ms_per_token < no_wait.mean_ms_per_token


@pytest.mark.parametrize("devices", [4, 8])
def test_closed_loop_devices_share_forwards_instead_of_alternating(devices):
    # Devices opening at different moments, 4 ms of drafting per block and a long forward:
    # the first block is verified alone while the rest queue. Taking only what queued
    # (batch_wait 0) then alternates batches of 1 and N-1 for ever; gathering once the model
    # is free and waiting for the open sessions (cloud/serving/scheduler.py) merges them into batches
    # of N after the first.
    calibration = free_network(draft_ms_per_token=1.0, verify=VerifyModel(a_ms=50.0, b_ms=0.0, c_ms=0.0))
    kwargs = dict(devices=devices, link_mix=ZERO_LINK, k=4, duration_s=3.0, start_spread_ms=20.0, seed=1)
    alternating = simulate_path(FleetConfig(batch_wait_ms=0.0, **kwargs), calibration)
    gathered = simulate_path(FleetConfig(batch_wait_ms=5.0, **kwargs), calibration)
    assert set(alternating.batch_sizes) == {1, devices - 1}
    assert gathered.batch_sizes[devices] >= gathered.forwards - 2
    assert gathered.mean_batch_size > devices - 0.2
    assert gathered.capacity_tokens_per_s > 1.5 * alternating.capacity_tokens_per_s


def test_a_batch_closes_once_every_open_session_is_in_and_respects_the_cap():
    # 6 devices, max batch 4, a wait far longer than a forward: batches never wait it out
    # (every open session is queued at once, or the batch is full), and never exceed the cap.
    calibration = free_network(verify=VerifyModel(a_ms=10.0, b_ms=0.0, c_ms=0.0))
    config = FleetConfig(devices=6, link_mix=ZERO_LINK, k=2, duration_s=2.0, max_batch_size=4, batch_wait_ms=500.0)
    result = simulate_path(config, calibration)
    assert max(result.batch_sizes) == 4
    assert result.mean_utilisation > 0.95  # no forward waited 500 ms for a seventh session


def test_a_session_far_away_no_longer_holds_the_forwards_of_the_near_ones():
    # Half the devices on loopback, half on satellite: waiting for every open session, each
    # forward of the near ones waited the whole 5 ms for drafts hundreds of ms away; waiting
    # only for the sessions expected back within the wait (the replica's rule), it does not.
    calibration = free_network(draft_ms_per_token=0.5, verify=VerifyModel(a_ms=10.0, b_ms=0.0, c_ms=0.0))
    kwargs = dict(devices=8, link_mix="loopback:0.5,satellite:0.5", k=4, duration_s=5.0, start_spread_ms=20.0, seed=1)
    every = simulate(FleetConfig(batch_wait_for="all", **kwargs), calibration)
    returning = simulate(FleetConfig(**kwargs), calibration)
    assert every.speculative.mean_gather_wait_ms > 4.0 > 2.0 > returning.speculative.mean_gather_wait_ms
    near = lambda result: result.speculative.per_link_ms_per_token()["loopback"]  # noqa: E731
    assert near(returning) < 0.9 * near(every)
    assert returning.speculative.capacity_tokens_per_s > every.speculative.capacity_tokens_per_s
    # A Generate stream is always back at once: the cloud-only path is the same under both rules.
    assert returning.cloud_only == every.cloud_only


def test_a_calls_setup_is_paid_in_parallel_and_its_prefill_queues():
    # 8 Generate calls at once: each pays 30 ms of setup (latency, side by side), then their
    # 10 ms prefills queue on the model thread one after another.
    calibration = free_network(prefill_ms=10.0, open_overhead_ms=30.0, verify=VerifyModel(a_ms=1.0, b_ms=0.0, c_ms=0.0))
    result = simulate_path(FleetConfig(devices=8, link_mix=ZERO_LINK, tokens_per_device=1), calibration, CLOUD_ONLY)
    assert 30.0 + 8 * 10.0 < min(result.ms_per_token) <= max(result.ms_per_token) < 30.0 + 8 * 10.0 + 10.0
    alone = simulate_path(FleetConfig(devices=1, link_mix=ZERO_LINK, k=4, tokens_per_device=1), calibration)
    assert alone.mean_ms_per_token == pytest.approx(30.0 + 10.0 + 0.1 + 1.0, rel=1e-6)  # a session opens the same way (1 draft)


def test_prefills_queue_on_the_model_thread():
    # The replica prefills on its one model thread, first come first served: with 8 sessions
    # opening at once even the first one's decode step queues behind all 8 prefills.
    calibration = free_network(prefill_ms=10.0, verify=VerifyModel(a_ms=1.0, b_ms=0.0, c_ms=0.0))
    result = simulate_path(FleetConfig(devices=8, link_mix=ZERO_LINK, tokens_per_device=1), calibration, CLOUD_ONLY)
    assert 8 * 10.0 < min(result.ms_per_token) <= max(result.ms_per_token) < 8 * 10.0 + 10.0
    assert result.mean_utilisation > 0.9


# ---- the ingress (proxy and replica I/O) ---------------------------------------------------


def test_one_speculative_round_costs_verify_plus_two_ingress_messages():
    s, remainder = 1.5, 0.7
    calibration = free_network(
        acceptance=(1.0,), verify=VerifyModel(a_ms=4.0, b_ms=0.0, c_ms=0.0),
        ingress_ms_per_round_message=s, round_overhead_ms=remainder,
    )
    result = simulate_path(FleetConfig(devices=1, link_mix=ZERO_LINK, k=4, tokens_per_device=500), calibration)
    assert result.rounds == 100 and result.batch_sizes == {1: 100}
    open_ms = 2 * s  # Open in, Opened out (prefill 0)
    round_ms = 4 * 0.1 + s + 4.0 + s + remainder
    assert result.mean_ms_per_token * 500 == pytest.approx(open_ms + 100 * round_ms, rel=1e-9)


def test_a_rounds_fixed_latency_is_paid_before_the_ingress_so_batches_stay_whole():
    # 16 replayed devices (no drafting), 0.7 ms per message, 4 ms of fixed latency per round.
    # The latency is the device's, the link's and the transport's: paid on the way up, while
    # the ingress handles the other sessions' messages, so every Draft still reaches the
    # ingress while it is busy and the batch (which cannot close while it is) stays whole.
    # (Paid after the ingress, the last rows would miss the gather and split the batches.)
    calibration = free_network(acceptance=(0.5,), draft_ms_per_token=1e-3, verify=VerifyModel(a_ms=40.0, b_ms=0.0, c_ms=0.0),
                               ingress_ms_per_round_message=0.7, round_overhead_ms=4.0)
    many = simulate_path(FleetConfig(devices=16, link_mix=ZERO_LINK, k=4, duration_s=5.0), calibration)
    assert sum(b * n for b, n in many.batch_sizes.items()) / many.forwards > 15.0
    alone = simulate_path(FleetConfig(devices=1, link_mix=ZERO_LINK, k=4, tokens_per_device=200), calibration)
    assert alone.rounds * (4.0 + 2 * 0.7 + 40.0) < alone.mean_ms_per_token * 200  # the lone round pays it all


def test_ingress_saturates_at_one_round_per_two_service_times():
    s, tokens_per_round = 2.0, 2  # k=1, every draft accepted
    calibration = free_network(
        acceptance=(1.0,), draft_ms_per_token=5.0, verify=VerifyModel(a_ms=0.1, b_ms=0.0, c_ms=0.0),
        ingress_ms_per_round_message=s,
    )
    configs = {n: FleetConfig(devices=n, link_mix=ZERO_LINK, k=1, duration_s=4.0) for n in (1, 4, 16)}
    runs = {n: simulate_path(config, calibration) for n, config in configs.items()}
    alone = 5.0 + 2 * s + 0.1  # one device is not limited by the ingress
    assert runs[1].mean_ms_per_token == pytest.approx(alone / tokens_per_round, rel=0.01)
    for n in (4, 16):  # n devices want more than 1 / (2 s) rounds/s: each gets 1/n of it
        rounds = (4000 - n * 2 * s) / (2 * s)  # what the Open/Opened messages leave of 4 s
        assert runs[n].rounds == pytest.approx(rounds, rel=0.01)
        assert runs[n].mean_ms_per_token == pytest.approx(4000 / (rounds / n * tokens_per_round), rel=0.01)
        assert runs[n].mean_ms_per_token > n * 2 * s / tokens_per_round  # grows with n
        assert runs[n].ingress_utilisation[0] > 0.99


def test_cloud_only_stream_is_capped_at_one_token_per_service_time():
    s = 1.0
    calibration = free_network(verify=VerifyModel(a_ms=0.2, b_ms=0.0, c_ms=0.0), ingress_ms_per_stream_message=s)
    one = simulate_path(FleetConfig(devices=1, link_mix=ZERO_LINK, tokens_per_device=400), calibration, CLOUD_ONLY)
    assert one.mean_ms_per_token * 400 == pytest.approx(s + 400 * (0.2 + s), rel=1e-9)  # request, then tokens
    many = simulate_path(FleetConfig(devices=16, link_mix=ZERO_LINK, duration_s=2.0), calibration, CLOUD_ONLY)
    # The batch cannot close while the ingress handles the other tokens (one event loop), so
    # the 16 sessions stay in one batch: a step is 16 messages, then one forward.
    assert many.batch_sizes.keys() == {16}
    assert many.capacity_tokens_per_s == pytest.approx(1000 * 16 / (16 * s + 0.2), rel=0.01)
    assert many.mean_ms_per_token == pytest.approx(16 * s + 0.2, rel=0.02)


def test_cloud_only_streams_of_a_batch_resume_together_and_stay_whole():
    # The latency after a decoding forward is paid once per batch, then each stream's message
    # takes the ingress in turn and its generator queues the next step right away: 16 streams
    # whose messages outlast the 5 ms gather (16 x 0.6 ms) still come back as one batch, and a
    # step is forward + latency + 16 messages. (Paid per stream after its message, a latency
    # this long would split the batches.)
    s, latency = 0.6, 3.0
    calibration = free_network(verify=VerifyModel(a_ms=50.0, b_ms=0.0, c_ms=0.0), ingress_ms_per_stream_message=s,
                               stream_overhead_ms=latency)
    many = simulate_path(FleetConfig(devices=16, link_mix=ZERO_LINK, duration_s=5.0), calibration, CLOUD_ONLY)
    assert many.batch_sizes[16] >= many.forwards - 2
    assert many.mean_ms_per_token == pytest.approx(50.0 + latency + 16 * s, rel=0.02)


def test_replicas_have_separate_ingress_queues():
    calibration = free_network(verify=VerifyModel(a_ms=0.1, b_ms=0.0, c_ms=0.0), ingress_ms_per_stream_message=1.0)
    two = simulate_path(FleetConfig(devices=16, replicas=2, link_mix=ZERO_LINK, duration_s=1.0), calibration, CLOUD_ONLY)
    assert two.capacity_tokens_per_s == pytest.approx(2 * 1000 * 8 / (8 * 1.0 + 0.1), rel=0.01)  # 8 messages + a forward each


# ---- configuration and calibration ---------------------------------------------------------


def test_link_mix_is_split_exactly_and_normalised():
    config = FleetConfig(devices=10, link_mix="wifi:5,4g:3,5g:2")
    names = [p.name for p in config.device_links()]
    assert (names.count("wifi"), names.count("4g"), names.count("5g")) == (5, 3, 2)
    assert sum(w for _, w in config.link_mix) == pytest.approx(1.0)
    assert [p.name for p, _ in parse_link_mix("wifi, 4g:2")] == ["wifi", "4g"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"devices": 0}, "devices"),
        ({"replicas": 0}, "replicas"),
        ({"k": 0}, "k"),
        ({"k": 20}, "k"),
        ({"link_mix": "wifi:0"}, "link_mix"),
        ({"link_mix": "dialup"}, "dialup"),
        ({"tokens_per_device": 10, "duration_s": 1.0}, "tokens_per_device"),
        ({"duration_s": -1.0}, "duration_s"),
        ({"batch_wait_ms": -1.0}, "batch_wait_ms"),
        ({"batch_wait_for": "some"}, "batch_wait_for"),
    ],
)
def test_fleet_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        FleetConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"acceptance": (0.5, 1.5)}, r"acceptance\[1\]"),
        ({"acceptance": ()}, "acceptance"),
        ({"draft_ms_per_token": 0}, "draft_ms_per_token"),
        ({"round_overhead_ms": -1}, "round_overhead_ms"),
        ({"ingress_ms_per_round_message": -1}, "ingress_ms_per_round_message"),
        ({"ingress_ms_per_stream_message": float("nan")}, "ingress_ms_per_stream_message"),
        ({"verify": {"a_ms": -1}}, "verify.a_ms"),
        ({"verify": {"batch": [1, 4], "tokens_per_row": [1], "ms": [[1.0]]}}, "verify.ms"),
        ({"verify": {"batch": [4, 1], "tokens_per_row": [1], "ms": [[1.0], [2.0]]}}, "verify.batch"),
    ],
)
def test_calibration_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Calibration(**kwargs)


def test_calibration_json_round_trip_and_table_interpolation(tmp_path):
    table = VerifyModel(batch=(1, 4), tokens_per_row=(1, 5), ms=((10.0, 12.0), (16.0, 20.0)))
    assert table(1, 1) == 10.0
    assert table(4, 5) == 20.0
    assert table(2, 3) == pytest.approx((11.0 * 2 + 18.0 * 1) / 3)  # bilinear
    assert table(8, 5) == pytest.approx(20.0 + (20.0 - 12.0) / 3 * 4)  # linear past the edge
    calibration = Calibration(source="measured on x", acceptance=(0.7, 0.6), verify=table, prefill_ms=3.0)
    path = tmp_path / "cal.json"
    calibration.save(path)
    assert Calibration.load(path) == calibration
    path.write_text(json.dumps({"acceptance": [0.5], "verify": {"a_ms": 3, "b_ms": 1, "c_ms": 0}}))
    loaded = Calibration.load(path)
    assert loaded.verify(2, 5) == 5.0 and loaded.draft_ms_per_token == Calibration().draft_ms_per_token
    # A file from before the ingress: its overheads were the whole per-message cost.
    path.write_text(json.dumps({"round_overhead_ms": 8.0, "stream_overhead_ms": 6.0}))
    legacy = Calibration.load(path)
    assert (legacy.round_overhead_ms, legacy.ingress_ms_per_round_message) == (8.0, 0.0)
    assert (legacy.stream_overhead_ms, legacy.ingress_ms_per_stream_message) == (6.0, 0.0)
    path.write_text(json.dumps({"ingress_ms_per_round_message": 4.0}))
    current = Calibration.load(path)
    assert current.round_overhead_ms == 0.0
    assert current.ingress_ms_per_stream_message == Calibration().ingress_ms_per_stream_message
    path.write_text(json.dumps({"acceptence": [0.5]}))
    with pytest.raises(ValueError, match="acceptence"):
        Calibration.load(path)


def test_default_calibration_is_marked_placeholder():
    assert "PLACEHOLDER" in Calibration.default().source
    assert "PLACEHOLDER" in simulate(FleetConfig(tokens_per_device=16)).table()


# ---- outputs ------------------------------------------------------------------------------


def test_plots_and_sweep_rows(tmp_path):
    calibration = free_network()
    link = LinkProfile("probe", bandwidth_up_mbit=10, bandwidth_down_mbit=10)
    speedup = speedup_vs_rtt([0, 50], calibration, tokens_per_device=50, link=link)
    best = optimal_k_vs_rtt([0, 50], ks=(1, 2, 4), calibration=calibration, tokens_per_device=50)
    capacity = capacity_vs_devices([1, 4], calibration, link_mix="lan", duration_s=0.5)
    for plot, rows, name in (
        (plot_speedup_vs_rtt, speedup, "a.png"),
        (plot_optimal_k, best, "b.png"),
        (plot_capacity, capacity, "c.png"),
    ):
        path = plot(rows, tmp_path / name)
        assert path.read_bytes()[:4] == b"\x89PNG"
    assert set(capacity[0]) >= {"devices", "speculative_tokens_per_s", "cloud_only_tokens_per_s"}


def test_cli_writes_result_json(tmp_path, capsys):
    from edgespec.cli import simulate as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        ["--devices", "6", "--link", "wifi:0.5,4g:0.5", "--replicas", "2", "--k", "auto",
         "--tokens-per-device", "40", "--out", str(tmp_path)]
    )
    assert cli.run(args) == 0
    printed = capsys.readouterr().out
    assert "speedup" in printed and "ms/token [4g]" in printed
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["speculative"]["tokens"] == 240
    assert len(result["per_device"]["link"]) == 6
    assert Calibration.load(tmp_path / "calibration.json") == Calibration.default()
    bad = parser.parse_args(["--link", "dialup:1"])
    assert cli.run(bad) == 2


def test_bench_calibration_fills_the_ingress_from_single_sessions():
    from types import SimpleNamespace

    from edgespec.cloud.bench.calibrate import calibrate
    from edgespec.edge.stats import RequestStats
    from edgespec.edge.types import Result, RoundRecord

    verify = VerifyModel(a_ms=2.0, b_ms=0.0, c_ms=0.5)  # verify(1, 5) = 4.5, verify(1, 1) = 2.5
    rounds = [RoundRecord(4, (1, 2, 3, 4), 1, 9, draft_ms=2.0, wait_ms=4.5 + 8.0, batch_size=1) for _ in range(6)]
    spec_stats = RequestStats(rounds=6, drafted=24, accepted=6, generated=12, wall_s=0.2, draft_s=0.012)
    spec = Result("", [1, 9] * 6, [5], "length", spec_stats, rounds)
    # 33 tokens: the first at 20 ms (request, prefill), then one every 2.5 + 6 ms.
    cloud_stats = RequestStats(generated=33, wall_s=(20 + 32 * 8.5) / 1000, first_token_s=0.020)
    cloud = Result("", [1] * 33, [5], "length", cloud_stats)
    harness = SimpleNamespace(
        run=lambda prompts, params, label: [spec],
        cloud_only=lambda prompt, params: cloud,
        client=SimpleNamespace(draft=SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids: "x" * len(ids)))),
        target="t", draft="d",
    )
    calibration = calibrate(harness, ["p"], verify, 3.0, k=4, progress=lambda line: None)
    assert calibration.ingress_ms_per_round_message == pytest.approx(4.0)
    assert calibration.ingress_ms_per_stream_message == pytest.approx(6.0)
    assert calibration.round_overhead_ms == calibration.stream_overhead_ms == 0.0
