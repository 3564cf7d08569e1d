"""KV memory: what a session holds, how many fit, and what each backend's policy costs.

    KV bytes per token = 2 x layers x kv_heads x head_dim x dtype bytes          (K and V)
    pool per GPU       = GPU memory x memory_utilization - weights / tp - activation reserve
    sessions that fit  = pool per GPU / (KV bytes per token per GPU x tokens held per session)

The two verifier backends hold a session's KV differently:

- **pinned** (the transformers backend): admission reserves prompt + max_new_tokens for the
  session's whole life, both paths; a speculative session keeps it while it is away on its
  device drafting and on the link. The pool caps sessions per replica at
  pool / (KV per token x (prompt + max_new_tokens)).
- **evictable** (the vLLM backend): a stream's blocks grow with its context (prompt +
  max_new_tokens / 2 on average) and are held while it streams, so cloud-only sessions are
  capped at pool / (KV per token x mean context); a speculative round is its own engine
  request, and between rounds the session's context is only cached, evictable. Past
  ``resident`` = that same cap, a returning round finds its context evicted with probability
  1 - resident / sessions (eviction of a random cached session: LRU under a round-robin of
  returns is worse, up to every return) and recomputes it: a prefill of the mean context, in
  the same forward. Memory never caps the speculative path; it costs GPU time instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.cloud.simulate.calibration import VerifyModel
from edgespec.cloud.simulate.hardware import GB, Deployment, MemoryParams

PINNED = "pinned"
EVICTABLE = "evictable"
POLICIES = (PINNED, EVICTABLE)
BACKEND_OF = {PINNED: "transformers", EVICTABLE: "vllm"}


@dataclass(frozen=True)
class Workload:
    """What a session's context is: its prompt and how many tokens it may generate."""

    prompt_tokens: int = 512
    max_new_tokens: int = 512

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.max_new_tokens < 1:
            raise ValueError(f"prompt_tokens and max_new_tokens must be >= 1, got {self.prompt_tokens}, {self.max_new_tokens}")

    @property
    def reserved_tokens(self) -> int:
        """What the transformers backend's admission reserves for the session's life."""
        return self.prompt_tokens + self.max_new_tokens

    @property
    def mean_context(self) -> float:
        """A session's context averaged over its generation (the KV a forward reads, on average)."""
        return self.prompt_tokens + self.max_new_tokens / 2


@dataclass(frozen=True)
class KvMemory:
    """One replica's KV arithmetic (module docstring), per GPU."""

    deployment: Deployment
    memory: MemoryParams
    dtype_bytes: int
    workload: Workload

    @property
    def bytes_per_token(self) -> int:
        return self.deployment.model.kv_bytes_per_token(self.dtype_bytes)

    @property
    def bytes_per_session(self) -> float:
        """A session's KV at its reserved length (the whole replica's, over its GPUs)."""
        return self.bytes_per_token * self.workload.reserved_tokens

    @property
    def pool_bytes_per_gpu(self) -> float:
        d = self.deployment
        pool = d.gpu.memory_gb * GB * self.memory.memory_utilization - d.model.weight_bytes(self.dtype_bytes) / d.tp \
            - self.memory.activation_reserve_gb * GB
        if pool <= 0:
            raise ValueError(f"{d.label}: the weights ({d.model.weight_bytes(self.dtype_bytes) / d.tp / GB:.1f} GB a GPU) "
                             f"leave no KV pool: use more GPUs (tensor parallelism)")
        return pool

    def sessions_fitting(self, tokens_per_session: float) -> int:
        per_gpu = self.deployment.kv_bytes_per_token_per_gpu(self.dtype_bytes) * tokens_per_session
        return int(self.pool_bytes_per_gpu // per_gpu)

    def cap(self, policy: str, speculative: bool) -> int | None:
        """Most sessions the pool lets a replica carry; None: memory does not cap (it costs recompute)."""
        if policy == PINNED:
            return self.sessions_fitting(self.workload.reserved_tokens)
        if policy != EVICTABLE:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        return None if speculative else self.resident

    @property
    def resident(self) -> int:
        """Sessions whose mean context the evictable cache holds at once."""
        return self.sessions_fitting(self.workload.mean_context)


def miss_rate(sessions: int, resident: int) -> float:
    """The share of returning rounds whose context was evicted (module docstring)."""
    return 0.0 if sessions <= resident else 1.0 - resident / sessions


def with_recompute(verify: VerifyModel, per_row_ms: float) -> VerifyModel:
    """The step with ``per_row_ms`` more per row: a forward's expected recompute (exact at the
    table's points, as the table is linear in batch between them)."""
    if per_row_ms <= 0:
        return verify
    if not verify.is_table:
        return VerifyModel(a_ms=verify.a_ms, b_ms=verify.b_ms + per_row_ms, c_ms=verify.c_ms)
    ms = tuple(tuple(v + per_row_ms * b for v in row) for b, row in zip(verify.batch, verify.ms))
    return VerifyModel(batch=verify.batch, tokens_per_row=verify.tokens_per_row, ms=ms)

