"""The per-link steady-state plan: the start-up is not in the percentile, what binds is named by a
rule, links speculation cannot serve within the SLO stream, and the search finds the edge."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import pytest

from edgespec.cloud.simulate.calibration import Calibration, VerifyModel
from edgespec.cloud.simulate.engine import CLOUD_ONLY, SPECULATIVE
from edgespec.cloud.simulate.hardware import Hardware
from edgespec.cloud.simulate.link_plan import (ADMISSION, GPU_TIME, INGRESS, KV_MEMORY, SLO_FLOOR, SteadyConfig,
                                               largest_within, open_spread_ms, plan_links, routed_to_cloud,
                                               window_ms_per_token)
from edgespec.cloud.simulate.memory import EVICTABLE, PINNED
from edgespec.cloud.simulate import link_plan

HW = Hardware.load()
CAL = Calibration(source="test", draft_ms_per_token=1.0, draft_cv=0.0, acceptance=(0.8, 0.75, 0.7, 0.65),
                  ingress_ms_per_round_message=0.05, ingress_ms_per_stream_message=0.05, prefill_ms=5.0)


def test_a_slow_start_before_the_window_is_not_in_the_percentile():
    # 2 tokens in the first second (a queued prefill), then 50 tokens a second (20 ms/token).
    arrivals = [(900.0, 2)] + [(1000.0 + 20.0 * i, 2 + i) for i in range(1, 201)]
    steady = window_ms_per_token(arrivals, 1000.0, 5000.0, 1000.0)
    assert steady == pytest.approx([20.0] * 4)
    with_start = window_ms_per_token(arrivals, 0.0, 5000.0, 1000.0)
    assert with_start[0] == pytest.approx(500.0)  # the start-up window, were it counted
    assert window_ms_per_token([(100.0, 5)], 1000.0, 2000.0, 1000.0) == [math.inf]  # nothing came: worst


def test_opens_are_spread_so_their_prefills_take_at_most_half_the_model():
    config = SteadyConfig()
    assert open_spread_ms(config, 4, 10.0) == 1500.0
    assert open_spread_ms(config, 200, 24.0) == 2 * 200 * 24.0


def test_what_binds_is_chosen_in_order():
    assert link_plan.binding(False, 0, None, 256, 0.9, 0.1) == SLO_FLOOR
    assert link_plan.binding(True, 101, 101, 256, 0.5, 0.1) == KV_MEMORY
    assert link_plan.binding(True, 256, None, 256, 0.5, 0.1) == ADMISSION
    assert link_plan.binding(True, 60, 101, 256, 0.4, 0.7) == INGRESS
    assert link_plan.binding(True, 60, None, 256, 0.8, 0.3) == GPU_TIME


def test_speculation_that_misses_the_slo_alone_is_routed_to_cloud_only():
    assert routed_to_cloud(speculative_floor_ms=41.7, slo_ms=30.0)
    assert not routed_to_cloud(speculative_floor_ms=17.9, slo_ms=30.0)


@pytest.mark.parametrize("guess", [None, 10, 40, 90])
def test_the_search_finds_the_last_count_within_the_slo(guess):
    calls = []

    def measure(m: int) -> float:
        calls.append(m)
        return 10.0 + 0.5 * m  # 37 sessions: 28.5 ms, 38: 29.0, 39: 29.5, 41: 30.5
    assert largest_within(measure, 30.0, 256, 1, guess) == 40
    assert len(calls) <= 12
    assert largest_within(measure, 5.0, 256) == 0
    assert largest_within(measure, 500.0, 256) == 256


def tiny(**changes) -> SteadyConfig:
    base = SteadyConfig(links=("wifi",), slos_ms=(60.0,), k=4, max_sessions=24, open_spread_s=0.2, settle_s=0.3,
                        measure_s=1.0, window_s=0.5)
    return dataclasses.replace(base, **changes)


def test_a_plan_names_both_paths_both_policies_and_what_binds():
    plan = plan_links(HW.deployment("llama-3-8b", "h100"), HW, CAL, tiny())
    assert {(r.path, r.policy) for r in plan.rows} == {(p, q) for p in (CLOUD_ONLY, SPECULATIVE) for q in (PINNED, EVICTABLE)}
    for row in plan.rows:
        assert row.sessions >= 1 and row.ms_per_token <= 60.0
        assert row.binds in (GPU_TIME, INGRESS, ADMISSION, KV_MEMORY)
        assert row.gpu_s_per_1k_tokens == pytest.approx(1000.0 / row.tokens_per_s_per_gpu)
    assert "wifi" in plan.table() and "| wifi | 60 |" in plan.markdown()
    json.dumps(plan.to_dict())


def test_a_far_link_streams_and_a_pinned_7b_pool_binds():
    config = tiny(links=("satellite",), slos_ms=(60.0,), max_sessions=256)
    small_pool = dataclasses.replace(HW, memory=dataclasses.replace(HW.memory, memory_utilization=0.26))  # ~3.3 GB of KV
    plan = plan_links(HW.deployment("llama-2-7b", "h100"), small_pool, CAL, config)
    assert plan.floors[("satellite", SPECULATIVE)] > 60.0
    speculative = plan.row("satellite", 60.0, SPECULATIVE, PINNED)
    assert speculative.routed and speculative.sessions == plan.row("satellite", 60.0, CLOUD_ONLY, PINNED).sessions
    cloud = plan.row("satellite", 60.0, CLOUD_ONLY, PINNED)
    assert cloud.binds == KV_MEMORY and cloud.sessions == plan.memory.cap(PINNED, False)


def test_a_measured_step_table_replaces_the_roofline():
    measured = VerifyModel(batch=(1, 64), tokens_per_row=(1, 17), ms=((30.0, 31.0), (40.0, 60.0)))
    plan = plan_links(HW.deployment("llama-3-8b", "h100"), HW, CAL, tiny(), measured)
    assert plan.step_source == "measured step table"
    assert plan.floors[("wifi", CLOUD_ONLY)] > 25.0  # a 30 ms step (the roofline's is 8 ms); windows round a little


def test_plan_command_prints_the_per_link_plan_and_writes_it(tmp_path, capsys):
    from edgespec.cli import simulate as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["plan", "--model", "llama-3-8b", "--gpu", "h100", "--link", "wifi", "--slo-ms", "60",
                              "--k", "4", "--max-sessions", "8", "--duration", "1", "--markdown", "--out", str(tmp_path)])
    assert cli.run(args) == 0
    out = capsys.readouterr().out
    assert "llama-3-8b on h100" in out and "binds" in out and "| wifi | 60 |" in out
    rows = json.loads((tmp_path / "plan.json").read_text())[0]["rows"]
    assert {r["policy"] for r in rows} == {PINNED, EVICTABLE}
    unknown = parser.parse_args(["plan", "--model", "gpt-9", "--gpu", "h100"])
    assert cli.run(unknown) == 2
