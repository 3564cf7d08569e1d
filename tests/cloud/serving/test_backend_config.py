"""The backend choice in VerifierConfig, vLLM's engine arguments and the GPU placement derived from
it: pure logic, no engine started."""

from __future__ import annotations

import pytest
from helpers import REPO

from edgespec.cloud.serving.app import deployment_override, gpu_placement, replica_actor_options
from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig
from edgespec.cloud.serving.vllm_backend import COUPLED_RACE, engine_args

DEMO_TARGET = str(REPO / "models" / "demo" / "target")


def config(**values) -> VerifierConfig:
    return VerifierConfig(model=DEMO_TARGET, **values)


@pytest.mark.parametrize("values, message", [
    (dict(backend="tensorrt"), "backend must be one of"),
    (dict(tensor_parallel_size=2), "need backend: vllm"),
    (dict(pipeline_parallel_size=2), "need backend: vllm"),
    (dict(engine_args={"gpu_memory_utilization": 0.8}), "engine_args are vLLM's"),
    (dict(backend="vllm", engine_process=True), "engine_process is the transformers backend's"),
    (dict(backend="vllm", tensor_parallel_size=0), "tensor_parallel_size must be >= 1"),
    (dict(backend="vllm", engine_args=["block_size", 32]), "engine_args must be a mapping"),
])
def test_a_backend_setting_that_cannot_hold_is_refused_naming_the_field(values, message):
    with pytest.raises(ValueError, match=message):
        config(**values)


def test_the_backend_and_its_settings_come_from_a_config_file_too():
    loaded = VerifierConfig.from_dict({"model": DEMO_TARGET, "backend": "vllm", "tensor_parallel_size": 4,
                                       "pipeline_parallel_size": 2, "engine_args": {"gpu_memory_utilization": 0.85}})
    assert (loaded.backend, loaded.gpus_per_replica, loaded.engine_args) == ("vllm", 8, {"gpu_memory_utilization": 0.85})


def test_engine_args_on_the_cpu_and_on_gpus():
    cpu = engine_args(config(backend="vllm", device="cpu", max_kv_bytes=1 << 28, max_context=512, max_sessions=8))
    assert cpu["dtype"] == "float32" and cpu["block_size"] == 32 and cpu["enforce_eager"]
    assert cpu["kv_cache_memory_bytes"] == 1 << 28 and cpu["max_model_len"] == 512
    assert cpu["enable_prefix_caching"] and cpu["skip_tokenizer_init"] and cpu["logits_processors"] == [COUPLED_RACE]
    assert "distributed_executor_backend" not in cpu
    gpus = engine_args(config(backend="vllm", device="cuda", tensor_parallel_size=4,
                              engine_args={"gpu_memory_utilization": 0.8, "dtype": "float16"}))
    assert gpus["dtype"] == "float16" and gpus["gpu_memory_utilization"] == 0.8  # the operator's word wins
    assert gpus["tensor_parallel_size"] == 4 and gpus["distributed_executor_backend"] == "ray"
    assert "block_size" not in gpus and "kv_cache_memory_bytes" not in gpus  # vLLM's own GPU defaults


def test_a_split_target_reserves_a_bundle_per_gpu_as_ray_serve_llm_does():
    options = DeploymentOptions(num_cpus=2, num_gpus=1)
    assert gpu_placement(config(), options) == {}
    assert replica_actor_options(config(), options)["num_gpus"] == 1
    tp = config(backend="vllm", tensor_parallel_size=4)
    assert gpu_placement(tp, options) == {
        "placement_group_bundles": [{"CPU": 2, "GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}],
        "placement_group_strategy": "STRICT_PACK",  # tensor parallel stays inside a node
    }
    assert replica_actor_options(tp, options)["num_gpus"] == 0  # the workers hold the bundles' GPUs
    pp = config(backend="vllm", tensor_parallel_size=8, pipeline_parallel_size=2)
    placement = gpu_placement(pp, options)
    assert len(placement["placement_group_bundles"]) == 16 and placement["placement_group_strategy"] == "PACK"
    assert gpu_placement(config(backend="vllm", device="cpu", tensor_parallel_size=2), options) == {}  # no GPU to reserve
    override = deployment_override(pp, options)
    assert override["placement_group_bundles"] == placement["placement_group_bundles"]
    assert override["ray_actor_options"]["num_gpus"] == 0


def test_autoscaling_aims_at_the_sessions_vllm_batches_together():
    options = DeploymentOptions(autoscaling_config={"max_replicas": 4})
    assert options.autoscaling(config(max_sessions=256))["target_ongoing_requests"] == 32  # the packed forward's max_batch_size
    assert options.autoscaling(config(backend="vllm", max_sessions=256))["target_ongoing_requests"] == 192
