"""The plan's arithmetic by hand: KV bytes from a model's shape, the KV pool and what each policy
lets a replica carry, and the roofline's step times (memory-bound, compute-bound, all-reduces)."""

from __future__ import annotations

import json

import pytest

from edgespec.cloud.simulate.calibration import VerifyModel
from edgespec.cloud.simulate.hardware import DATA, Hardware
from edgespec.cloud.simulate.memory import EVICTABLE, PINNED, KvMemory, Workload, miss_rate, with_recompute
from edgespec.cloud.simulate import roofline

HW = Hardware.load()
RL = HW.roofline


def test_kv_bytes_per_token_follow_the_models_shapes():
    # 2 (K and V) x layers x KV heads x head dim x 2 bytes (bf16)
    assert HW.model("llama-2-7b").kv_bytes_per_token(2) == 2 * 32 * 32 * 128 * 2 == 524_288  # MHA: 0.5 MiB
    assert HW.model("llama-3-8b").kv_bytes_per_token(2) == 131_072  # GQA, 8 KV heads: a quarter of it
    assert HW.model("llama-3-70b").kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2 == 327_680


def test_tensor_parallel_splits_kv_heads_and_keeps_a_whole_head_per_gpu():
    assert HW.deployment("llama-3-70b", "h100").tp == 8  # cluster/serve-70b.yaml
    assert HW.deployment("llama-3-70b", "h200").tp == 4
    assert HW.deployment("llama-3-8b", "h100").tp == 1
    assert HW.deployment("llama-3-70b", "h100").kv_bytes_per_token_per_gpu(2) == 327_680 / 8
    assert HW.deployment("llama-3-70b", "h100", tp=16).kv_bytes_per_token_per_gpu(2) == 327_680 / 8  # 8 KV heads: replicated


def test_pool_and_what_each_policy_lets_a_7b_replica_carry():
    memory = KvMemory(HW.deployment("llama-2-7b", "h100"), HW.memory, 2, Workload(512, 512))
    pool = 80e9 * 0.9 - 6.74e9 * 2 - 4e9
    assert memory.pool_bytes_per_gpu == pytest.approx(pool)
    assert memory.bytes_per_session == 524_288 * 1024  # 0.54 GB at 1k tokens
    assert memory.cap(PINNED, speculative=True) == int(pool // (524_288 * 1024)) == 101
    assert memory.cap(PINNED, speculative=False) == 101  # the transformers backend pins both paths
    assert memory.cap(EVICTABLE, speculative=False) == memory.resident == int(pool // (524_288 * 768)) == 135
    assert memory.cap(EVICTABLE, speculative=True) is None  # speculation pays recompute instead


def test_a_model_whose_weights_fill_the_gpu_has_no_pool():
    with pytest.raises(ValueError, match="no KV pool"):
        _ = KvMemory(HW.deployment("llama-3-70b", "h100", tp=1), HW.memory, 2, Workload()).pool_bytes_per_gpu


def test_evicted_returns_and_their_recompute_in_the_step():
    assert miss_rate(100, 135) == 0.0
    assert miss_rate(270, 135) == pytest.approx(0.5)
    table = VerifyModel(batch=(1, 8), tokens_per_row=(1, 5), ms=((10.0, 11.0), (12.0, 14.0)))
    assert with_recompute(table, 2.0)(8, 5) == pytest.approx(14.0 + 8 * 2.0)
    assert with_recompute(table, 0.0) is table
    assert with_recompute(VerifyModel(a_ms=10.0, b_ms=0.1, c_ms=0.0), 2.0)(4, 1) == pytest.approx(10.0 + 4 * 2.1)


def test_a_decode_step_at_batch_one_is_the_weights_over_bandwidth_plus_overhead():
    deployment = HW.deployment("llama-2-7b", "h100")
    one = roofline.step(deployment, RL, 1, 1, 768)
    bandwidth = 3.35e12 * 0.8
    expected = 2.0 + (6.74e9 * 2 + 768 * 524_288) / bandwidth * 1e3  # 2 ms + 5.03 + 0.15
    assert one.bound == "memory"
    assert one.all_reduce_ms == 0.0
    assert one.ms == pytest.approx(expected)
    assert 7.0 < one.ms < 7.4


def test_many_rows_of_many_tokens_turn_the_step_compute_bound():
    deployment = HW.deployment("llama-3-8b", "h100")
    wide = roofline.step(deployment, RL, 128, 5, 768)
    flops = 2 * 8.03e9 * 640 + 4 * 32 * 32 * 128 * 768 * 640
    assert wide.flops == pytest.approx(flops)
    assert wide.bound == "compute"
    assert wide.compute_ms == pytest.approx(flops / (989e12 * 0.6) * 1e3)
    assert wide.ms == pytest.approx(2.0 + wide.compute_ms)


def test_tensor_parallel_pays_two_all_reduces_a_layer():
    deployment = HW.deployment("llama-3-70b", "h100")  # TP 8
    one = roofline.step(deployment, RL, 1, 1, 768)
    message = 8192 * 2  # one token's hidden state, bf16
    per_call = 8e-3 + 2 * 7 / 8 * message / 450e9 * 1e3
    assert one.all_reduce_ms == pytest.approx(80 * 2 * per_call)
    assert one.weight_bytes == pytest.approx(70.55e9 * 2 / 8)
    assert one.ms == pytest.approx(2.0 + one.memory_ms + one.all_reduce_ms)


def test_h200_bandwidth_shortens_the_memory_bound_step():
    h100 = roofline.step(HW.deployment("llama-3-8b", "h100"), RL, 1, 1, 768)
    h200 = roofline.step(HW.deployment("llama-3-8b", "h200"), RL, 1, 1, 768)
    assert (h100.ms - 2.0) / (h200.ms - 2.0) == pytest.approx(4.8 / 3.35)


def test_the_table_the_simulator_reads_is_the_roofline_at_its_points():
    deployment = HW.deployment("llama-3-8b", "h100")
    table = roofline.verify_table(deployment, RL, 768)
    assert table.is_table
    assert table(64, 5) == pytest.approx(roofline.step(deployment, RL, 64, 5, 768).ms)
    assert table(1, 1) == pytest.approx(roofline.step(deployment, RL, 1, 1, 768).ms)


def test_hardware_data_is_checked_on_load(tmp_path):
    data = json.loads(DATA.read_text())
    del data["models"]["llama-3-8b"]["kv_heads"]
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="kv_heads"):
        Hardware.load(path)
    with pytest.raises(ValueError, match="unknown model"):
        HW.model("gpt-5")
