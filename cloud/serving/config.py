"""Configuration of the verifier: one dataclass, validated on construction.

Every field can be set from the command line (``edgespec serve``), from a Serve config
file (``cluster/serve.yaml``, under the application's ``args``) or from Python.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.edge.settings import build_config

DTYPES = ("auto", "float32", "float16", "bfloat16", "float64")
BACKENDS = ("transformers", "vllm")
BATCH_WAIT_FOR = ("returning", "all")


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
        batch_wait_for: which open sessions that wait is for. "returning" (the default): only
            those whose next draft is expected within it, from each session's measured round
            trip (a Generate stream always: its next step follows at once); a speculative
            session on a slow link, tens of ms away, no longer holds every forward for the
            whole wait. "all": every open session (the rule before, kept for comparison).
        torch_threads: intra-op threads for the target (pin to 1 when sharing cores).
        dtype: weights, activations and KV pool dtype; "auto" (the default) is bfloat16 on a
            GPU and float32 on the CPU; an explicit name is used as given.
        device: "cpu", "cuda" or "auto" (cuda when a GPU is visible).
        session_idle_timeout_s: a session that sends nothing for this long is closed
            (DEADLINE_EXCEEDED) and its KV cache freed.
        first_message_timeout_s: a stream whose first message (the Open) does not arrive
            within this time is closed (DEADLINE_EXCEEDED). A device sends its Open as soon as
            the stream starts (one round trip); 2 s leaves room for a slow link without
            letting silent streams linger.
        max_pending_streams: streams that have started but whose Open has not arrived yet,
            per replica; past it the oldest of them is shed (RESOURCE_EXHAUSTED) for the new
            one. Serve's request slots are sized to hold these on top of max_sessions
            (``max_ongoing_requests``), so silent streams can never take the slot a session
            or a new device's Open needs (see ``admission.PendingOpens``).
        max_pending_streams_per_key: the same bound per API key (with keys configured), where
            one more is refused at once (RESOURCE_EXHAUSTED): one key's silent streams take at
            most this many places, never another key's.
        api_keys_file: YAML/JSON file of API keys (``cloud/serving/auth.py``), re-read when it
            changes; with it (or ``api_keys_env``) every request needs a key.
        api_keys_env: name of an environment variable holding the same mapping as JSON.
        allowed_origins: the web origins (``https://app.example.com``, scheme://host[:port]) whose
            pages may use the WebSocket route and /v1/info (``websocket.py``): a browser always sends
            its page's Origin, and one not listed is closed 4007 PERMISSION_DENIED before any work.
            Empty (the default) admits no browser page; ``*`` admits every one. Requests without an
            Origin (native apps, Node, devices) are not affected.
        allow_unauthenticated: without keys the verifier answers callers on its own machine only (a
            replica's own port, 40000-41000 with the HAProxy ingress, listens on every
            interface); True serves any caller without a key.
        max_kv_bytes: KV cache the replica may hand out, in bytes: the size of its KV pool
            (``kv_pool.py``; at most what max_sessions full-context sessions need). Each session
            reserves the pages of (prompt + its max_new_tokens, within max_context, + one round's
            drafts) at Open, and a session that would pass the budget is refused RESOURCE_EXHAUSTED.
        max_q_entries: most entries of one draft distribution q (exact mode's sparse q).
        model_stuck_s: the health check fails (and Serve restarts the replica) when one model
            job has run this long.
        max_tree_tokens: most tokens of one tree draft (greedy; ``Draft.parents``); 0 accepts
            chains only.
        engine_process: run the model in a child process of the replica, so the forward's
            Python code never holds the replica's GIL while drafts arrive and a crashed engine
            fails the replica's health check. Off by default: on 2 shared CPU cores the extra
            process cost ~13% of verify throughput at 16 sessions (scripts/bench_verify.py).
        backend: the engine the target runs on. "transformers" (the default): our own engine, a
            paged KV pool in the replica, the replica's batch scheduler, every verification mode and
            trees; each session's KV is reserved for its whole life. "vllm": vLLM's ``AsyncLLM``
            (``vllm_backend.py``; ``pip install edgespec[vllm]``): continuous batching, KV kept in
            vLLM's prefix cache (evictable while a device is away, recomputed on its return),
            targets split over GPUs; greedy speculation and Generate (greedy or sampled) only.
        tensor_parallel_size: GPUs one replica splits the target over within a node (vllm only).
        pipeline_parallel_size: pipeline stages of the target, across nodes (vllm only). The
            replica reserves one placement-group bundle per GPU (tensor x pipeline).
        engine_args: further vLLM ``AsyncEngineArgs`` (vllm only), e.g. ``gpu_memory_utilization``,
            ``block_size``, ``kv_cache_memory_bytes``; they override what the verifier derives.
            On the CPU the KV space is ``max_kv_bytes`` unless given here.
        profile_cpu: keep a ledger of the replica's CPU per verify message by phase (decode,
            validation, scheduling, encode, ...; ``cpu_ledger.py``), read by ``edgespec bench
            overhead``. Off by default (two clock reads per phase when on).
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
    batch_wait_for: str = "returning"
    torch_threads: int = 1
    dtype: str = "auto"
    device: str = "auto"
    session_idle_timeout_s: float = 60.0
    engine_process: bool = False
    profile_cpu: bool = False
    max_tree_tokens: int = 32
    first_message_timeout_s: float = 2.0
    max_pending_streams: int = 64
    max_pending_streams_per_key: int = 8
    api_keys_file: str = ""
    api_keys_env: str = ""
    allow_unauthenticated: bool = False
    allowed_origins: tuple[str, ...] = ()
    max_kv_bytes: int = 4 << 30
    max_q_entries: int = 1024
    model_stuck_s: float = 120.0
    backend: str = "transformers"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    engine_args: dict[str, Any] = field(default_factory=dict)

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
        for name in ("first_message_timeout_s", "model_stuck_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        _positive(self, "max_kv_bytes", "max_q_entries", "max_pending_streams", "max_pending_streams_per_key")
        if self.api_keys_file and not Path(self.api_keys_file).is_file():
            raise ValueError(f"api_keys_file: {self.api_keys_file!r} is not a file")
        object.__setattr__(self, "allowed_origins", checked_origins(self.allowed_origins))
        if self.max_tree_tokens < 0:
            raise ValueError(f"max_tree_tokens must be >= 0 (0 = chains only), got {self.max_tree_tokens}")
        if self.batch_wait_timeout_s < 0:
            raise ValueError(f"batch_wait_timeout_s must be >= 0, got {self.batch_wait_timeout_s}")
        if self.batch_wait_for not in BATCH_WAIT_FOR:
            raise ValueError(f"batch_wait_for must be one of {BATCH_WAIT_FOR}, got {self.batch_wait_for!r}")
        if self.session_idle_timeout_s <= 0:
            raise ValueError(f"session_idle_timeout_s must be > 0, got {self.session_idle_timeout_s}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in ("cpu", "cuda", "auto") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be cpu, cuda, cuda:N or auto, got {self.device!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        _positive(self, "tensor_parallel_size", "pipeline_parallel_size")
        if self.backend != "vllm":
            if self.gpus_per_replica > 1:
                raise ValueError("tensor_parallel_size and pipeline_parallel_size need backend: vllm (the transformers "
                                 "backend runs a target on one device)")
            if self.engine_args:
                raise ValueError("engine_args are vLLM's: set backend: vllm, or remove them")
        elif self.engine_process:
            raise ValueError("engine_process is the transformers backend's: vLLM's engine core always runs in its own process")
        if not isinstance(self.engine_args, dict) or not all(isinstance(name, str) for name in self.engine_args):
            raise ValueError(f"engine_args must be a mapping of vLLM engine argument names to values, got {self.engine_args!r}")

    @property
    def gpus_per_replica(self) -> int:
        """The devices one replica's target spans (tensor x pipeline parallel)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "") -> "VerifierConfig":
        return build_config(cls, values, source)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def round_tokens(self) -> int:
        """The most new tokens one round feeds the target: the pending token and a chain or tree."""
        return 1 + max(self.max_k, self.max_tree_tokens)

    def message_cap(self, max_context: int) -> int:
        """The largest request a client needs to send, in bytes (varints of at most 5 bytes, a
        float of 4, plus framing): an Open with a full-context prompt and as many stop tokens,
        or a Draft of max_k tokens each with a full q, or a tree of max_tree_tokens."""
        open_bytes = 10 * max_context + 1024
        draft_bytes = self.max_k * (10 * self.max_q_entries + 16) + 10 * max(self.max_k, self.max_tree_tokens) + 256
        return max(open_bytes, draft_bytes) + 4096


@dataclass(frozen=True)
class DeploymentOptions:
    """Ray Serve placement of the verifier deployment, its autoscaling and its drain."""

    num_replicas: int | None = None  # a fixed count (1 when neither this nor autoscaling_config is set)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    # Streams, Generate calls, Info and health checks all count against Serve's
    # max_ongoing_requests (``max_ongoing_requests()``): room above max_sessions and
    # max_pending_streams for the short calls.
    extra_ongoing_requests: int = 16
    # Requests waiting for one of those slots; beyond this many Serve refuses at once
    # (RESOURCE_EXHAUSTED) instead of queueing without bound.
    max_queued_requests: int = 32
    ray_actor_options: dict[str, Any] = field(default_factory=dict)
    # Serve's own autoscaling_config (min_replicas, max_replicas, upscale_delay_s, ...). One
    # session stream is one ongoing request; target_ongoing_requests, when not given, comes from
    # max_sessions and max_batch_size (``autoscaling_config()``).
    autoscaling_config: dict[str, Any] | None = None
    # A replica being stopped tells its sessions to move at their next round (drain.py); Serve
    # waits this long for them before it kills the replica (HAProxy mode: at least 35 s).
    graceful_shutdown_timeout_s: float = 60.0
    graceful_shutdown_wait_loop_s: float = 0.5

    def __post_init__(self) -> None:
        if self.num_replicas is not None and self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if self.num_replicas is not None and self.autoscaling_config:
            raise ValueError("set num_replicas or autoscaling_config, not both (autoscaling picks the count)")
        if self.max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {self.max_queued_requests}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("num_cpus and num_gpus must be >= 0")
        if self.graceful_shutdown_timeout_s < 0 or self.graceful_shutdown_wait_loop_s <= 0:
            raise ValueError("graceful_shutdown_timeout_s must be >= 0 and graceful_shutdown_wait_loop_s > 0")
        if self.autoscaling_config is not None:
            unknown = set(self.autoscaling_config) - AUTOSCALING_KEYS
            if unknown:
                raise ValueError(f"unknown autoscaling_config key(s) {sorted(unknown)}; known: {sorted(AUTOSCALING_KEYS)}")

    def autoscaling(self, config: "VerifierConfig") -> dict[str, Any] | None:
        """Serve's autoscaling_config, with target_ongoing_requests derived when not given:
        three quarters of max_sessions (room for sessions that arrive while a new replica
        starts, which takes tens of seconds with a large model), and at most max_batch_size
        (past it one forward no longer verifies every session, and per-session ms/token steps up)."""
        if not self.autoscaling_config:
            return None
        policy = {"min_replicas": 1, "upscale_delay_s": 30.0, "downscale_delay_s": 300.0, **self.autoscaling_config}
        # vLLM batches every session it holds (max_batch_size is the transformers backend's packed forward)
        batch = config.max_sessions if config.backend == "vllm" else config.max_batch_size
        policy.setdefault("target_ongoing_requests", target_ongoing_requests(config.max_sessions, batch))
        return policy

    @property
    def replicas(self) -> str:
        """For messages: the fixed count, or the autoscaling range."""
        if self.autoscaling_config:
            low, high = self.autoscaling_config.get("min_replicas", 1), self.autoscaling_config.get("max_replicas", "?")
            return f"{low}-{high} (autoscaling)"
        return str(self.num_replicas or 1)


def max_ongoing_requests(config: VerifierConfig, options: DeploymentOptions) -> int:
    """Serve's request slots per replica: every session, every stream still waiting for its
    Open and the short calls. The verifier itself refuses (RESOURCE_EXHAUSTED, at once)
    sessions over max_sessions and waiting streams over max_pending_streams, so Serve's slots
    never run out first: a stream that got one is answered by the verifier, not left in
    Serve's queue behind silent streams."""
    return config.max_sessions + config.max_pending_streams + options.extra_ongoing_requests


# Serve's AutoscalingConfig fields that a deployment may set (ray 2.60).
AUTOSCALING_KEYS = frozenset({
    "min_replicas", "initial_replicas", "max_replicas", "target_ongoing_requests", "look_back_period_s",
    "upscale_delay_s", "downscale_delay_s", "downscale_to_zero_delay_s", "upscaling_factor", "downscaling_factor",
    "aggregation_function", "metrics_interval_s",
})


def target_ongoing_requests(max_sessions: int, max_batch_size: int) -> float:
    """Sessions per replica the autoscaler aims for (see ``DeploymentOptions.autoscaling``)."""
    return float(max(1, min(round(0.75 * max_sessions), max_batch_size)))


# The context assumed for a model whose config names none (ALiBi models such as BLOOM).
DEFAULT_MAX_CONTEXT = 2048


def model_max_context(config: VerifierConfig) -> int:
    """The context the verifier will serve, from the config or the model's config.json (no model load)."""
    if config.max_context:
        return config.max_context
    try:
        data = json.loads((Path(config.model) / "config.json").read_text())
    except (OSError, ValueError):
        data = {}
    text = data.get("text_config") or data
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = text.get(name) or data.get(name)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_MAX_CONTEXT


ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s]+")


def checked_origins(origins: Any) -> tuple[str, ...]:
    """``allowed_origins`` as a tuple of lowercase origins; ValueError names a malformed entry."""
    if isinstance(origins, str) or not all(isinstance(origin, str) for origin in origins):
        raise ValueError(f"allowed_origins must be a list of origins such as https://app.example.com, got {origins!r}")
    checked = tuple(origin.lower() for origin in origins)
    for origin in checked:
        if origin != "*" and not ORIGIN.fullmatch(origin):
            raise ValueError(f"allowed_origins: {origin!r} is not an origin: give scheme://host[:port] (no path, no "
                             "trailing slash), e.g. https://app.example.com, or * for every origin")
    return checked


def _positive(config: Any, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
