"""The SDK's response types: what the server serves, what a generation returned.

The request side (``GenerationParams``) is in ``edgespec.edge.params``."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.edge.stats import RequestStats


@dataclass(frozen=True)
class ServerInfo:
    model_id: str
    tokenizer_fingerprint: str
    vocab_size: int
    max_context: int
    max_k: int
    max_new_tokens: int
    modes: tuple[str, ...]
    version: str
    target_params: int = 0
    kv_bytes_per_token: int = 0
    replica_rss_bytes: int = 0
    active_sessions: int = 0
    forward_ms: float = 0.0  # the replica's recent forward + accept time (0: not measured yet)
    decode_ms: float = 0.0  # the replica's recent decoding step of a Generate stream (0: not measured yet)
    stream_ms: float = 0.0  # the replica's recent time per token of a Generate stream, reply to reply (0: not told)
    max_sessions: int = 0  # limits (0: not told by an older server)
    free_sessions: int = 0
    session_idle_timeout_s: float = 0.0
    first_message_timeout_s: float = 0.0
    default_max_new_tokens: int = 0
    max_message_bytes: int = 0
    max_q_entries: int = 0
    auth_required: bool = False
    send_ahead: bool = False  # the verifier accepts blocks sent ahead of the previous verdict
    max_tree_tokens: int = 0  # most tokens of a tree draft (0: chains only)


@dataclass(frozen=True)
class ReplicaProbe:
    """One Info round trip as the planner's probe sees it: its ms, and the replica's recent figures
    that Info reports (0: not measured yet)."""

    rtt_ms: float
    forward_ms: float = 0.0  # verify forward + accept
    decode_ms: float = 0.0  # a Generate stream's decoding step
    stream_ms: float = 0.0  # a Generate stream's time per token, reply to reply


@dataclass(frozen=True)
class RoundRecord:
    """One verification round as the device saw it (for diagnosis and benchmarks)."""

    k: int
    drafts: tuple[int, ...]
    accepted: int
    next_token: int
    draft_ms: float
    wait_ms: float  # send -> verdict (from the previous verdict, for a block sent ahead)
    batch_size: int
    verify_ms: float = 0.0  # the replica's forward + accept time for this round's batch
    wall_ms: float = 0.0  # previous verdict (or the segment's start) -> this verdict


@dataclass
class Result:
    """A finished generation: the text, the generated token ids, why it stopped, and stats."""

    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    finish_reason: str
    stats: RequestStats = field(default_factory=RequestStats)
    rounds: list[RoundRecord] = field(default_factory=list)
    # Which path produced the tokens, in order: ("speculative" | "cloud_only", how many).
    segments: list[tuple[str, int]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "segments": [list(segment) for segment in self.segments],
            "stats": self.stats.to_dict(),
        }
