"""Per-request statistics: a dataclass of counters, every rate derived in one place.

Terms: a round sends k drafted tokens and receives a verdict (n accepted + 1 more token).
The acceptance length of a round is n + 1: it counts the recovered or bonus token, as vLLM
and EAGLE report it. Target calls count verification rounds (each one target forward).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RequestStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0  # tokens committed by this request (what the user receives)
    target_calls: int = 0
    resumes: int = 0  # streams re-opened after a break
    moves: int = 0  # streams re-opened because their replica was shutting down (drain)
    ahead_hits: int = 0  # blocks sent ahead of the previous verdict that were verified
    discarded_blocks: int = 0  # blocks sent ahead whose assumption failed (no forward ran for them)
    cloud_only_tokens: int = 0  # tokens the target decoded alone (Generate): cloud-only path
    switches: int = 0  # changes between speculation and cloud-only within the request
    bytes_sent: int = 0  # protobuf payload + 5-byte gRPC frame header per message
    bytes_received: int = 0
    wall_s: float = 0.0
    draft_s: float = 0.0  # time spent drafting on the device
    wait_s: float = 0.0  # send -> verdict: network round trip plus verification
    first_token_s: float = 0.0  # request start -> first committed token
    # drafted_at[i] / accepted_at[i]: drafts at position i+1 of a block, and how many passed.
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    k_history: list[int] = field(default_factory=list)
    server_batch_sizes: list[int] = field(default_factory=list)
    move_outages_s: list[float] = field(default_factory=list)  # per move: last token before -> first after
    replica_ids: list[str] = field(default_factory=list)  # the replica of each speculative stream, in order
    # k=auto's decisions: the path it started on and each switch, with the two predicted
    # ms/token and the reason (``planner.Switch``), in order.
    switch_log: list[dict] = field(default_factory=list)
    # Sampled requests: the seed every draw was keyed by (drawn from the OS when none was
    # given): pass it as ``seed`` to replay the text. None for greedy requests.
    seed: int | None = None

    def record_round(self, k: int, accepted: int, emitted: int, *, batch_size: int = 0) -> None:
        """Counts one verified round: ``k`` drafts, ``accepted`` passed, ``emitted`` committed."""
        self.rounds += 1
        self.target_calls += 1
        self.drafted += k
        self.accepted += accepted
        self.generated += emitted
        self.k_history.append(k)
        if batch_size:
            self.server_batch_sizes.append(batch_size)
        while len(self.drafted_at) < k:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(k):
            self.drafted_at[i] += 1
            if i < accepted:
                self.accepted_at[i] += 1

    @classmethod
    def combined(cls, items: "list[RequestStats]") -> "RequestStats":
        """One set of counters for several requests (rates then weigh every round alike)."""
        out = cls()
        for item in items:
            for name, value in asdict(item).items():
                if isinstance(value, (int, float)) and name != "seed":
                    setattr(out, name, getattr(out, name) + value)
            for name in ("drafted_at", "accepted_at"):
                mine, theirs = getattr(out, name), getattr(item, name)
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, value in enumerate(theirs):
                    mine[i] += value
            out.k_history.extend(item.k_history)
            out.server_batch_sizes.extend(item.server_batch_sizes)
            out.move_outages_s.extend(item.move_outages_s)
            out.replica_ids.extend(item.replica_ids)
            out.switch_log.extend(item.switch_log)
        return out

    # ---- derived rates -------------------------------------------------------------------

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens committed per verification round, the recovered/bonus token included (tau)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Share of drafts at block position i+1 that were accepted (given they were sent)."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def target_calls_per_token(self) -> float:
        return self.target_calls / self.generated if self.generated else 0.0

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.wall_s / self.generated if self.generated else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.wall_s if self.wall_s else 0.0

    @property
    def draft_ms_per_token(self) -> float:
        return 1000.0 * self.draft_s / self.drafted if self.drafted else 0.0

    @property
    def bytes_per_round(self) -> float:
        return (self.bytes_sent + self.bytes_received) / self.rounds if self.rounds else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        for name in (
            "acceptance_rate",
            "mean_acceptance_length",
            "acceptance_by_position",
            "target_calls_per_token",
            "ms_per_token",
            "tokens_per_s",
            "draft_ms_per_token",
            "bytes_per_round",
        ):
            out[name] = getattr(self, name)
        return out

    def summary(self) -> str:
        if not self.rounds:  # cloud-only generation: no drafting, one target call per token
            return (
                f"{self.generated} tokens in {self.wall_s:.2f}s ({self.ms_per_token:.1f} ms/token), "
                f"cloud-only, target calls/token {self.target_calls_per_token:.2f}"
                + (f", seed {self.seed}" if self.seed is not None else "")
            )
        by_pos = " ".join(f"{rate:.2f}" for rate in self.acceptance_by_position)
        return (
            f"{self.generated} tokens in {self.wall_s:.2f}s ({self.ms_per_token:.1f} ms/token), "
            f"{self.rounds} rounds, acceptance {self.acceptance_rate:.1%}, "
            f"mean acceptance length {self.mean_acceptance_length:.2f}, "
            f"target calls/token {self.target_calls_per_token:.2f}, "
            f"per position [{by_pos}], draft {self.draft_ms_per_token:.2f} ms/token, "
            f"{self.bytes_per_round:.0f} B/round"
            + (f", {self.ahead_hits} sent ahead / {self.discarded_blocks} discarded" if self.ahead_hits or self.discarded_blocks else "")
            + (f", {self.cloud_only_tokens} cloud-only tokens, {self.switches} switch(es)" if self.cloud_only_tokens else "")
            + (f", {self.resumes} resume(s)" if self.resumes else "")
            + (f", seed {self.seed}" if self.seed is not None else "")
            + (f", moved {self.moves} time(s) (longest outage {max(self.move_outages_s, default=0) * 1000:.0f} ms)" if self.moves else "")
        )
