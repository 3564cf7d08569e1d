"""The replica probe between cells: what it reads off raw streams' replies, and how the
calibration is carried to the load it reads (pure logic: no server)."""

from __future__ import annotations

import pytest

from edgespec.cloud.bench.probe import ProbeReplies, ReplicaProbe, calibration_now
from edgespec.cloud.simulate import Calibration, VerifyModel


def _replies(lone_step: float, burst_step: float, *, message: float = 0.3, latency: float = 0.5) -> ProbeReplies:
    lone_gaps = [(1, lone_step, lone_step + latency + message)] * 40
    burst_gaps = [(16, burst_step, burst_step + latency + 16 * message)] * 160 + [(2, 30.0, 200.0)] * 4
    # 3 lone streams of 65 tokens: the first token 20 ms after the prefill's start, then one per gap.
    gap = lone_step + latency + message
    lone = [(65, (120.0 + 64 * gap) / 1000, 0.120)] * 3
    return ProbeReplies(tuple(lone), tuple(lone_gaps), tuple(burst_gaps))


def _probe(lone_step: float, burst_step: float, **costs: float) -> ReplicaProbe:
    return ReplicaProbe.from_replies(_replies(lone_step, burst_step, **costs))


def test_probe_reads_the_decode_steps_stream_costs_and_prefill():
    probe = _probe(20.0, 100.0)
    assert probe.decode_ms_by_batch == {1: pytest.approx(20.0), 16: pytest.approx(100.0)}
    assert probe.stream_message_ms == pytest.approx(0.3) and probe.stream_latency_ms == pytest.approx(0.5)
    assert probe.prefill_ms == pytest.approx(120.0 - 20.8 - 0.3)  # first token less a steady one less its message
    assert probe.burst_batch_mean == pytest.approx(164 / (10 + 2))  # 10 forwards of 16, 2 of 2


def test_probes_around_a_stretch_pool_their_replies():
    before, after = _replies(20.0, 100.0), _replies(20.0, 120.0)
    pooled = before + after
    assert len(pooled.lone) == 6 and len(pooled.burst_gaps) == 2 * 164
    probe = ReplicaProbe.from_replies(pooled)
    assert probe.decode_ms_by_batch[1] == pytest.approx(20.0) and 100.0 <= probe.decode_ms_by_batch[16] <= 120.0
    assert probe.stream_message_ms == pytest.approx(0.3) and probe.stream_latency_ms == pytest.approx(0.5)
    # The 1-session cells take the lone streams between them, and only the bursts' gaps.
    assert pooled.only_lone().burst_gaps == () and pooled.only_burst().lone == ()
    assert ReplicaProbe.from_replies(before.only_lone() + after.only_burst()).decode_ms_by_batch[16] == pytest.approx(120.0)


def test_calibration_now_scales_the_batch_curve_and_takes_the_probes_stream_costs():
    cells = {(1, 2): 21.0, (1, 5): 26.0, (16, 2): 110.0, (16, 5): 150.0}
    base, now = _probe(20.0, 125.0), _probe(18.0, 100.0, message=0.2, latency=0.7)
    calibration = Calibration(source="t", verify=VerifyModel(a_ms=1.0), ingress_ms_per_round_message=1.0,
                              round_overhead_ms=5.0)
    moved = calibration_now(calibration, cells, base, now)
    assert moved.verify(1, 1) == pytest.approx(18.0) and moved.verify(16, 1) == pytest.approx(100.0)
    assert moved.verify(1, 5) == pytest.approx(26.0 * 0.9) and moved.verify(16, 5) == pytest.approx(150.0 * 0.8)
    assert moved.ingress_ms_per_stream_message == pytest.approx(0.2) and moved.stream_overhead_ms == pytest.approx(0.7)
    assert moved.prefill_ms == pytest.approx(now.prefill_ms)
    assert moved.ingress_ms_per_round_message == 1.0  # what the probe does not read stays as calibrated
    assert moved.round_overhead_ms == pytest.approx(5.0 * 18.0 / 20.0)  # a round's own latency moves as the lone step


def test_a_first_token_splits_into_the_calls_setup_and_the_prefill_by_one_token_prompts():
    # Lone streams: first token at 120 ms (setup 40 + prefill 59.2 + step 20 + latency 0.5 + 2 x 0.3).
    replies = _replies(20.0, 100.0)
    # One-token prompts: setup 40 + a step's worth of tiny forwards 20 + latency 0.5 + 2 x 0.3.
    short = ProbeReplies(short_first_s=(0.0611, 0.0611, 0.0700))
    probe = ReplicaProbe.from_replies(replies + short)
    assert probe.open_overhead_ms == pytest.approx(40.0)
    assert probe.prefill_ms + probe.open_overhead_ms == pytest.approx(_probe(20.0, 100.0).prefill_ms)
    assert (replies + short).only_lone().short_first_s == short.short_first_s
    # A setup read above the whole opening (noise) leaves no negative prefill.
    slow = ReplicaProbe.from_replies(replies + ProbeReplies(short_first_s=(0.5,)))
    assert slow.prefill_ms == 0.0 and slow.open_overhead_ms == pytest.approx(_probe(20.0, 100.0).prefill_ms)


def test_the_one_session_speculative_cell_is_predicted_prompt_by_prompt():
    from edgespec.cloud.bench.replay import Script
    from edgespec.cloud.bench.simcheck import predict_profile
    from edgespec.cloud.link.profiles import PROFILES

    output = list(range(10, 42))
    easy = Script([1, 2], output, list(output))  # the draft always right
    hard = Script([3, 4], output, [0] * len(output))  # never
    middling = Script([5, 6], output, [t if i % 2 else 0 for i, t in enumerate(output)])
    calibration = Calibration(source="t", draft_ms_per_token=0.5, verify=VerifyModel(a_ms=10.0, b_ms=0.0, c_ms=0.0),
                              prefill_ms=0.0, ingress_ms_per_round_message=0.0, ingress_ms_per_stream_message=0.0)
    measured = {"measured": {"spec_1": 5.0, "cloud_1": 10.0, "spec_n": 5.0, "cloud_n": 10.0},
                "single_prompt_ids": [s.prompt_ids for s in (easy, hard, middling)]}
    row = predict_profile(PROFILES["loopback"], calibration, calibration, [easy, hard, middling], measured,
                          sessions=2, k=4, max_new_tokens=32)
    per_prompt = row["predicted_by_prompt"]["spec_1"]
    assert per_prompt[0] < per_prompt[2] < per_prompt[1]  # easy, middling, hard
    assert row["predicted"]["spec_1"] == per_prompt[2]  # the median prompt's
    assert row["errors"]["spec_1"] == per_prompt[2] / 5.0 - 1.0


def test_the_n_stream_cell_is_predicted_at_its_own_moments_load():
    """The N-session cloud-only arm runs minutes apart from the speculative one, between its own
    probes: given their calibration, only the cloud-only N cell's prediction moves."""
    from dataclasses import replace

    from edgespec.cloud.bench.replay import Script
    from edgespec.cloud.bench.simcheck import predict_profile
    from edgespec.cloud.link.profiles import PROFILES

    output = list(range(10, 42))
    script = Script([1, 2], output, list(output))
    calibration = Calibration(source="t", draft_ms_per_token=0.5, verify=VerifyModel(a_ms=10.0, b_ms=1.0, c_ms=0.0),
                              prefill_ms=0.0, ingress_ms_per_round_message=0.0, ingress_ms_per_stream_message=0.0)
    slower = replace(calibration, verify=VerifyModel(a_ms=20.0, b_ms=2.0, c_ms=0.0))
    measured = {"measured": {"spec_1": 5.0, "cloud_1": 10.0, "spec_n": 5.0, "cloud_n": 10.0},
                "single_prompt_ids": [script.prompt_ids]}
    args = (PROFILES["loopback"], calibration, calibration, [script], measured)
    same = predict_profile(*args, sessions=4, k=4, max_new_tokens=32)["predicted"]
    moved = predict_profile(*args, sessions=4, k=4, max_new_tokens=32, replayed_cloud=slower)["predicted"]
    assert {key: moved[key] for key in ("spec_1", "cloud_1", "spec_n")} == {key: same[key] for key in ("spec_1", "cloud_1", "spec_n")}
    assert moved["cloud_n"] > 1.5 * same["cloud_n"]
