"""The capacity plan: deterministic, monotonic in devices, speculation saves replicas where it pays."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from edgespec.cloud.serving.config import target_ongoing_requests
from edgespec.cloud.simulate import Calibration, VerifyModel
from edgespec.cloud.simulate.plan import CapacityPlan, PlanConfig, batch_curve, plan

# A GPU-sized target (a 12 ms batch-1 step, cheap extra rows), a fast draft, a cheap ingress:
# the regime where speculation pays on WiFi/5G.
GPU = Calibration(
    source="test", draft_ms_per_token=1.0, draft_cv=0.0, acceptance=(0.8, 0.75, 0.7, 0.65),
    verify=batch_curve(12.0, 0.1, 0.02), ingress_ms_per_round_message=0.1, ingress_ms_per_stream_message=0.05,
    prefill_ms=5.0,
)
# A 70B-class target (40 ms step): speculation pays per session on every link of the mix.
BIG = dataclasses.replace(GPU, verify=batch_curve(40.0, 0.3, 0.05))
MIX = "wifi:0.5,5g:0.3,4g:0.2"


def small(devices: int, **changes) -> PlanConfig:
    values = dict(devices=devices, link_mix=MIX, goal_ms_per_token=40.0, max_sessions=64, duration_s=3.0, seed=0)
    values.update(changes)
    return PlanConfig(**values)


def test_batch_curve_is_the_step_at_batch_one_plus_rows_and_tokens():
    curve = batch_curve(12.0, 0.1, 0.02)
    assert curve(1, 1) == pytest.approx(12.0)
    assert curve(8, 5) == pytest.approx(11.88 + 0.8 + 0.02 * 40)
    with pytest.raises(ValueError, match="target_step_ms"):
        batch_curve(0.1, 0.1, 0.1)


def test_same_seed_same_plan_and_the_golden_figures():
    first, second = plan(small(10_000, goal_ms_per_token=45.0), BIG), plan(small(10_000, goal_ms_per_token=45.0), BIG)
    assert first.to_dict() == second.to_dict()
    # Golden: a change to the engine or the search that moves these must be looked at.
    assert (first.speculative.sessions_per_replica, first.speculative.replicas) == GOLDEN_SPECULATIVE
    assert (first.cloud_only.sessions_per_replica, first.cloud_only.replicas) == GOLDEN_CLOUD_ONLY


GOLDEN_SPECULATIVE = (53, 189)  # (49, 205) while the gather waited for every open session (batch_wait_for="all")
GOLDEN_CLOUD_ONLY = (8, 1250)


def test_replicas_never_fall_when_devices_grow():
    replicas = [plan(small(n), GPU) for n in (10, 100, 1_000, 10_000)]
    for path in ("speculative", "cloud_only"):
        counts = [getattr(p, path).replicas for p in replicas]
        assert counts == sorted(counts), (path, counts)
        per_replica = {getattr(p, path).sessions_per_replica for p in replicas}
        assert len(per_replica) == 1  # the per-replica answer does not depend on the fleet's size


def test_speculation_needs_fewer_replicas_where_it_pays():
    result = plan(small(10_000, goal_ms_per_token=45.0), BIG)
    assert result.speculative.meets_goal and result.cloud_only.meets_goal
    assert result.speculative.replicas < result.cloud_only.replicas
    assert result.replica_ratio > 1.0


def test_the_sessions_found_meet_the_goal_and_one_more_does_not():
    config = small(1_000, goal_ms_per_token=45.0)
    result = plan(config, BIG)
    for path_plan in (result.speculative, result.cloud_only):
        probes = dict(path_plan.probes)
        m = path_plan.sessions_per_replica
        assert m < config.max_sessions  # the goal binds in this scenario
        assert probes[m] <= 45.0 < probes[m + 1]


def test_an_unreachable_goal_says_so():
    result = plan(small(100, goal_ms_per_token=30.0), BIG)  # cloud-only: a 40 ms step per token
    assert not result.cloud_only.meets_goal and result.cloud_only.replicas is None
    assert result.replica_ratio is None and result.autoscaling("cloud_only") is None
    assert "unreachable" in result.table()


def test_without_a_goal_each_replica_carries_max_sessions():
    result = plan(small(1_000, goal_ms_per_token=None, max_sessions=32), GPU)
    assert result.speculative.sessions_per_replica == result.cloud_only.sessions_per_replica == 32
    assert result.speculative.replicas == 32  # ceil(1000 / 32)


def test_concurrency_scales_the_sessions_not_the_per_replica_answer():
    full, tenth = plan(small(10_000), GPU), plan(small(10_000, concurrency=0.1), GPU)
    assert tenth.speculative.sessions_per_replica == full.speculative.sessions_per_replica
    assert tenth.speculative.replicas == -(-1_000 // full.speculative.sessions_per_replica)


def test_autoscaling_policy_matches_the_servers_own_derivation():
    result = plan(small(10_000, goal_ms_per_token=45.0), BIG)
    policy = result.autoscaling()
    target = policy["autoscaling_config"]["target_ongoing_requests"]
    assert target == result.speculative.sessions_per_replica
    assert policy["autoscaling_config"]["max_replicas"] == result.speculative.replicas
    assert target_ongoing_requests(policy["max_sessions"], result.config.max_batch_size) == target


def test_plan_config_validates_its_fields():
    for bad, match in ((dict(concurrency=0.0), "concurrency"), (dict(goal_stat="p50"), "goal_stat"),
                       (dict(goal_ms_per_token=-1.0), "goal_ms_per_token"), (dict(max_sessions=0), "max_sessions")):
        with pytest.raises(ValueError, match=match):
            small(10, **bad)


def test_plan_command_prints_and_writes_the_plan(tmp_path, capsys):
    from edgespec.cli import simulate as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps(VerifyModel(a_ms=11.0, b_ms=0.5, c_ms=0.1).to_dict()))
    args = parser.parse_args(["plan", "--devices", "500", "--link", MIX, "--batch-curve", str(curve),
                              "--goal-ms-per-token", "60", "--max-sessions", "32", "--duration", "2", "--out", str(tmp_path)])
    assert cli.run(args) == 0
    printed = capsys.readouterr().out
    assert "sessions per replica" in printed and "autoscaling" in printed
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["config"]["devices"] == 500 and written["speculative"]["replicas"] >= 1
    both = parser.parse_args(["plan", "--devices", "5", "--batch-curve", str(curve), "--target-step-ms", "12"])
    assert cli.run(both) == 2


def test_plan_result_table_names_both_paths():
    result = plan(small(100), GPU)
    assert isinstance(result, CapacityPlan)
    text = result.table()
    assert "speculative" in text and "cloud-only" in text and "replicas" in text
