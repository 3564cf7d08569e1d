"""Greedy speculative decoding simulated offline: a draft drafts k tokens a round against a
known continuation (the target's greedy text), as the device does, with or without context
lookup. Acceptance length tau counts the target's extra token (it is in [1, k + 1]), as vLLM and
EAGLE report it; the acceptance rate is accepted / drafted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from edgespec.edge.lookup import LookupConfig, lookup_next


@dataclass
class Acceptance:
    """Counters of a simulated greedy speculative run; rates derived in one place."""

    k: int
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)  # rounds whose i-th draft was accepted

    def __post_init__(self) -> None:
        if not self.accepted_at:
            self.accepted_at = [0] * self.k

    def add_round(self, n_accepted: int) -> None:
        self.rounds += 1
        self.drafted += self.k
        self.accepted += n_accepted
        for i in range(n_accepted):
            self.accepted_at[i] += 1

    @property
    def tau(self) -> float:
        """Mean tokens committed per target forward (accepted + 1)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_position(self) -> list[float]:
        return [a / self.rounds if self.rounds else 0.0 for a in self.accepted_at]



@torch.no_grad()
def simulate_greedy(
    draft, prompt: torch.Tensor, continuation: torch.Tensor, k: int, stats: Acceptance, lookup: LookupConfig | None = None
) -> None:
    """Adds the rounds of greedy speculative decoding of ``continuation`` [n] after ``prompt`` [m] to ``stats``.

    The draft keeps a KV cache of the committed tokens; drafted-but-rejected tokens are cropped
    away after each round, as the edge client does. Only full rounds (k drafts plus the target's
    extra token inside the continuation) are counted. ``lookup``: draft as the edge client does
    with context lookup (``edgespec.edge.lookup``) instead of the model's argmax alone.
    """
    out = draft(input_ids=prompt[None], use_cache=True)
    cache, next_logits = out.cache, out.logits[0, -1]
    committed, n = prompt.numel(), continuation.numel()
    done = 0  # continuation tokens committed so far
    while done + k + 1 <= n:
        guesses, logits = [], next_logits
        context = prompt.tolist() + continuation[:done].tolist() if lookup is not None else []
        for i in range(k):
            guess = int(logits.argmax())
            found = lookup_next(context + guesses, lookup) if lookup is not None else None
            guesses.append(guess if found is None else found)
            if i + 1 < k:
                logits = draft(input_ids=torch.tensor([[guesses[-1]]]), cache=cache, use_cache=True).logits[0, -1]
        truth = continuation[done : done + k].tolist()
        accepted = 0
        while accepted < k and guesses[accepted] == truth[accepted]:
            accepted += 1
        stats.add_round(accepted)
        # keep the cache of the committed prefix plus the accepted drafts it already holds,
        # then feed the tokens it lacks (the rest of the accepted run and the target's token)
        kept = min(accepted, k - 1)
        if kept < k - 1:  # NOTE: DynamicCache.crop only takes a negative count in transformers 5
            cache.crop(kept - (k - 1))
        new = continuation[done + kept : done + accepted + 1]
        next_logits = draft(input_ids=new[None], cache=cache, use_cache=True).logits[0, -1]
        committed += accepted + 1
        done += accepted + 1
