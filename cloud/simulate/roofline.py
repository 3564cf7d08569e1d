"""A GPU step model you can check by hand: the time of one batched forward from bytes and FLOPs.

Per GPU of a replica split over ``tp`` GPUs, for a forward of ``batch`` rows of ``tokens`` tokens
each (a speculative row is k + 1 tokens, a decode step 1) over ``context`` tokens of KV per row:

    weight bytes  = params x dtype / tp                             (read once per forward)
    KV bytes      = batch x context x kv_bytes_per_token / tp       (each row reads its cache;
                                                                     a GPU holds ceil(kv_heads / tp) heads)
    FLOPs         = (2 x params x batch x tokens
                     + 4 x layers x heads x head_dim x context x batch x tokens) / tp
    memory time   = (weight bytes + KV bytes) / (HBM bandwidth x hbm_efficiency)
    compute time  = FLOPs / (peak bf16 x flops_efficiency)
    all-reduce    = layers x all_reduces_per_layer x (latency + 2 (tp-1)/tp x batch x tokens x hidden x dtype / NVLink)
                    (0 at tp 1)
    step          = step_overhead + max(memory time, compute time) + all-reduce

A prefill of L tokens is one row of L tokens over a causal context (attention over L/2 on
average). The parameters are ``hardware.json``'s ``roofline``; a measured step table (the
calibration's ``verify`` schema, ``--batch-curve``) replaces the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.cloud.simulate.calibration import VerifyModel
from edgespec.cloud.simulate.hardware import GB, Deployment, RooflineParams

# The grid on which the roofline is tabulated for the simulator (bilinear between points).
BATCH_GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
TOKENS_GRID = (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 17)


@dataclass(frozen=True)
class Step:
    """One forward's parts, in ms, and what it moved (per GPU)."""

    weight_bytes: float
    kv_bytes: float
    flops: float
    memory_ms: float
    compute_ms: float
    all_reduce_ms: float
    overhead_ms: float

    @property
    def ms(self) -> float:
        return self.overhead_ms + max(self.memory_ms, self.compute_ms) + self.all_reduce_ms

    @property
    def bound(self) -> str:
        return "memory" if self.memory_ms >= self.compute_ms else "compute"


def step(deployment: Deployment, params: RooflineParams, batch: int, tokens: int, context: float,
         *, attention_context: float | None = None) -> Step:
    """One forward (module docstring); ``attention_context`` overrides the context attended to
    (a prefill's causal mean) while ``context`` is the KV read."""
    model, gpu, tp, dtype = deployment.model, deployment.gpu, deployment.tp, params.dtype_bytes
    rows_tokens = batch * tokens
    weight_bytes = model.weight_bytes(dtype) / tp
    kv_bytes = batch * context * deployment.kv_bytes_per_token_per_gpu(dtype)
    attended = context if attention_context is None else attention_context
    flops = (2 * model.params * rows_tokens + 4 * model.layers * model.heads * model.head_dim * attended * rows_tokens) / tp
    memory_ms = (weight_bytes + kv_bytes) / (gpu.hbm_tb_s * 1e12 * params.hbm_efficiency) * 1e3
    compute_ms = flops / (gpu.bf16_tflops * 1e12 * params.flops_efficiency) * 1e3
    return Step(weight_bytes, kv_bytes, flops, memory_ms, compute_ms, all_reduce_ms(deployment, params, rows_tokens),
                params.step_overhead_ms)


def all_reduce_ms(deployment: Deployment, params: RooflineParams, rows_tokens: int) -> float:
    """A forward's all-reduces (ring: each GPU sends and receives 2 (tp-1)/tp of the message)."""
    tp = deployment.tp
    if tp == 1:
        return 0.0
    message = rows_tokens * deployment.model.hidden * params.dtype_bytes
    one = params.all_reduce_latency_us * 1e-3 + 2 * (tp - 1) / tp * message / (deployment.gpu.nvlink_gb_s * GB) * 1e3
    return deployment.model.layers * params.all_reduces_per_layer * one


def prefill_ms(deployment: Deployment, params: RooflineParams, tokens: int) -> float:
    """One row of ``tokens`` prompt tokens, attending causally (L/2 on average), writing its KV."""
    return step(deployment, params, 1, tokens, 0.0, attention_context=tokens / 2).ms


def verify_table(deployment: Deployment, params: RooflineParams, context: float) -> VerifyModel:
    """The roofline tabulated for the simulator (the calibration's measured-table form)."""
    ms = tuple(tuple(step(deployment, params, b, t, context).ms for t in TOKENS_GRID) for b in BATCH_GRID)
    return VerifyModel(batch=BATCH_GRID, tokens_per_row=TOKENS_GRID, ms=ms)
