"""Configuration of the verifier: one dataclass, validated on construction.

Every field can be set from the command line (``edgespec serve``), from a Serve config
file (``cluster/serve.yaml``, under the application's ``args``) or from Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.edge.settings import build_config

DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class VerifierConfig:
    """What one verifier replica serves and how it batches.

    Attributes:
        model: local directory of a Hugging Face causal LM (config.json, weights,
            tokenizer.json). No hub downloads: the path must exist on every node.
        model_id: name reported by Info; defaults to the directory name.
        max_k: most draft tokens accepted in one round.
        max_context: longest sequence (prompt + generated) a session may reach;
            0 means the model's ``max_position_embeddings``.
        max_new_tokens: hard cap on tokens generated per session or Generate call.
        default_max_new_tokens: used when a request leaves max_new_tokens at 0.
        max_sessions: concurrent sessions (and Generate calls) per replica; the
            deployment's ``max_ongoing_requests`` is derived from it.
        max_batch_size: most sessions verified in one target forward.
        batch_wait_timeout_s: once the model is free, how long a batch waits for more of the
            open sessions to send their drafts before the forward starts (it starts at once
            when every open session is in). 0 batches only what queued during the previous
            forward; a few ms lets sessions that are a round trip away join (see scheduler.py).
        torch_threads: intra-op threads for the target (pin to 1 when sharing cores).
        dtype: weights and activations dtype; float32 on CPU, bfloat16/float16 on GPU.
        device: "cpu", "cuda" or "auto" (cuda when a GPU is visible).
        session_idle_timeout_s: a session that sends nothing for this long is closed
            (DEADLINE_EXCEEDED) and its KV cache freed.
        max_tree_tokens: most tokens of one tree draft (greedy; ``Draft.parents``); 0 accepts
            chains only.
        engine_process: run the model in a child process of the replica, so the forward's
            Python code never holds the replica's GIL while drafts arrive and a crashed engine
            fails the replica's health check. Off by default: on 2 shared CPU cores the extra
            process cost ~13% of verify throughput at 16 sessions (scripts/bench_verify.py).
    """

    model: str
    model_id: str = ""
    max_k: int = 16
    max_context: int = 0
    max_new_tokens: int = 2048
    default_max_new_tokens: int = 128
    max_sessions: int = 64
    max_batch_size: int = 32
    batch_wait_timeout_s: float = 0.005
    torch_threads: int = 1
    dtype: str = "float32"
    device: str = "auto"
    session_idle_timeout_s: float = 300.0
    engine_process: bool = False
    max_tree_tokens: int = 32

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: a local model directory is required")
        if not (Path(self.model) / "config.json").is_file():
            raise ValueError(f"model: {self.model!r} is not a Hugging Face model directory (no config.json)")
        if not self.model_id:
            object.__setattr__(self, "model_id", Path(self.model).resolve().name)
        _positive(self, "max_k", "max_new_tokens", "default_max_new_tokens", "max_sessions", "max_batch_size", "torch_threads")
        if self.max_context < 0:
            raise ValueError(f"max_context must be >= 0 (0 = the model's limit), got {self.max_context}")
        if self.default_max_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"default_max_new_tokens ({self.default_max_new_tokens}) must not exceed "
                f"max_new_tokens ({self.max_new_tokens})"
            )
        if self.max_tree_tokens < 0:
            raise ValueError(f"max_tree_tokens must be >= 0 (0 = chains only), got {self.max_tree_tokens}")
        if self.batch_wait_timeout_s < 0:
            raise ValueError(f"batch_wait_timeout_s must be >= 0, got {self.batch_wait_timeout_s}")
        if self.session_idle_timeout_s <= 0:
            raise ValueError(f"session_idle_timeout_s must be > 0, got {self.session_idle_timeout_s}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in ("cpu", "cuda", "auto") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be cpu, cuda, cuda:N or auto, got {self.device!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "") -> "VerifierConfig":
        return build_config(cls, values, source)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DeploymentOptions:
    """Ray Serve placement of the verifier deployment."""

    num_replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    # Streams, Generate calls, Info and health checks all count against Serve's
    # max_ongoing_requests; leave room above max_sessions for the short calls.
    extra_ongoing_requests: int = 16
    ray_actor_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("num_cpus and num_gpus must be >= 0")


def _positive(config: Any, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
