"""The SDK's request and response types."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.edge.stats import RequestStats

MODES = ("greedy", "exact", "token")


@dataclass(frozen=True)
class GenerationParams:
    """What to generate and how; validated on construction.

    mode: "greedy" (token-identical to the target's greedy output), "exact" (speculative
    sampling with the draft distribution q on the wire) or "token" (sampling with tokens only
    on the wire). Defaults to greedy at temperature 0 and exact otherwise.
    k: drafted tokens per round, a number or "auto" (adaptive from measured acceptance and cost).
    stop_token_ids: None means the draft's end-of-sequence ids (from its manifest).
    top_n: exact mode sends q truncated to its top_n tokens (0 = all tokens with q > 0);
    the device samples from exactly what it sends.
    draft_ahead: keep drafting while a block is in flight, assuming it will be accepted whole;
    pays off on slow links and slow drafts (see docs/links.md), costs device compute otherwise.
    lookup: greedy only; where the last few tokens occurred earlier in the context, draft the
    token that followed them there instead of the draft model's argmax (code repeats itself;
    a one-layer draft cannot copy). The output is the target's either way.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    mode: str | None = None
    k: int | str = "auto"
    stop_token_ids: tuple[int, ...] | None = None
    top_n: int = 64
    draft_ahead: bool = False
    lookup: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_n < 0:
            raise ValueError(f"top_n must be >= 0, got {self.top_n}")
        mode = self.mode or ("greedy" if self.temperature == 0 else "exact")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if mode != "greedy" and self.temperature == 0:
            raise ValueError(f"mode {mode!r} samples: set temperature > 0, or use mode 'greedy'")
        object.__setattr__(self, "mode", mode)
        if isinstance(self.k, str) and self.k != "auto" and not self.k.isdigit():
            raise ValueError(f"k must be a positive integer or 'auto', got {self.k!r}")
        if not isinstance(self.k, str) and self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")


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


@dataclass(frozen=True)
class RoundRecord:
    """One verification round as the device saw it (for diagnosis and benchmarks)."""

    k: int
    drafts: tuple[int, ...]
    accepted: int
    next_token: int
    draft_ms: float
    wait_ms: float
    batch_size: int


@dataclass
class Result:
    """A finished generation: the text, the generated token ids, why it stopped, and stats."""

    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    finish_reason: str
    stats: RequestStats = field(default_factory=RequestStats)
    rounds: list[RoundRecord] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }
