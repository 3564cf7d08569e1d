"""The targets and GPUs a capacity plan is made for, read from ``hardware.json`` (one place for
every shape and data-sheet figure: nothing of the kind is written in code).

    from edgespec.cloud.simulate.hardware import Hardware
    hw = Hardware.load()
    hw.model("llama-3-8b").kv_bytes_per_token(2)   # 131072
    hw.deployment("llama-3-70b", "h100").tp        # 8, as cluster/serve-70b.yaml
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("hardware.json")
GB = 1e9


def _build(cls, name: str, values: dict[str, Any]):
    known = {f.name for f in fields(cls)} - {"name"}
    missing, unknown = sorted(known - set(values)), sorted(set(values) - known)
    if missing or unknown:
        raise ValueError(f"{cls.__name__} {name!r}: missing {missing}, unknown {unknown}")
    return cls(name=name, **values)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape (its config.json)."""

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int  # == heads: multi-head attention; fewer: grouped-query
    head_dim: int
    vocab: int

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V, every layer, every KV head: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def weight_bytes(self, dtype_bytes: int) -> float:
        return self.params * dtype_bytes


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's data-sheet figures (SXM, bf16 dense)."""

    name: str
    memory_gb: float
    hbm_tb_s: float
    bf16_tflops: float
    nvlink_gb_s: float  # per direction, for the all-reduces of tensor parallelism


@dataclass(frozen=True)
class RooflineParams:
    """The step model's assumptions (``roofline.py`` has the formula)."""

    name: str
    dtype_bytes: int
    hbm_efficiency: float  # the share of the data sheet's bandwidth a decode step reaches
    flops_efficiency: float  # the share of peak FLOPs a large matmul reaches
    step_overhead_ms: float  # per forward: launches, sampling, the scheduler, the accept rule
    all_reduce_latency_us: float  # one all-reduce's fixed cost over NVLink
    all_reduces_per_layer: int  # attention output and MLP output


@dataclass(frozen=True)
class MemoryParams:
    """What of a GPU's memory the KV pool gets."""

    name: str
    memory_utilization: float  # the share of each GPU the server may take (vLLM's gpu_memory_utilization)
    activation_reserve_gb: float  # per GPU, for activations, logits and the CUDA context


@dataclass(frozen=True)
class Deployment:
    """One replica: a model split over ``tp`` GPUs of one kind."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int

    def kv_bytes_per_token_per_gpu(self, dtype_bytes: int) -> float:
        """Each GPU holds its share of the KV heads (one whole head each where tp > kv_heads)."""
        m = self.model
        return 2 * m.layers * math.ceil(m.kv_heads / self.tp) * m.head_dim * dtype_bytes

    @property
    def label(self) -> str:
        return f"{self.model.name} on {self.gpu.name}" + (f" x{self.tp} (TP {self.tp})" if self.tp > 1 else "")


@dataclass(frozen=True)
class Hardware:
    models: dict[str, ModelSpec]
    gpus: dict[str, GpuSpec]
    tensor_parallel: dict[str, dict[str, int]]
    roofline: RooflineParams
    memory: MemoryParams

    @classmethod
    def load(cls, path: Path = DATA) -> "Hardware":
        data = json.loads(Path(path).read_text())
        return cls(
            models={name: _build(ModelSpec, name, v) for name, v in data["models"].items()},
            gpus={name: _build(GpuSpec, name, v) for name, v in data["gpus"].items()},
            tensor_parallel={m: {g: int(tp) for g, tp in by_gpu.items()} for m, by_gpu in data.get("tensor_parallel", {}).items()},
            roofline=_build(RooflineParams, "roofline", data["roofline"]),
            memory=_build(MemoryParams, "memory", data["memory"]),
        )

    def model(self, name: str) -> ModelSpec:
        if name not in self.models:
            raise ValueError(f"unknown model {name!r}; known: {sorted(self.models)}")
        return self.models[name]

    def gpu(self, name: str) -> GpuSpec:
        if name not in self.gpus:
            raise ValueError(f"unknown GPU {name!r}; known: {sorted(self.gpus)}")
        return self.gpus[name]

    def deployment(self, model: str, gpu: str, tp: int | None = None) -> Deployment:
        """A replica of ``model`` on ``gpu``; ``tp`` defaults to the layout's (1 where none is named)."""
        degree = tp if tp is not None else self.tensor_parallel.get(model, {}).get(gpu, 1)
        if degree < 1:
            raise ValueError(f"tensor-parallel degree must be >= 1, got {degree}")
        return Deployment(self.model(model), self.gpu(gpu), degree)
