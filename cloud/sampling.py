"""The target distribution p: logits -> probabilities under temperature, top-k and top-p.

Same semantics as ``edgespec.edge.sampling.probs_from_logits`` on the device (a test checks
the two agree): temperature first, then top-k, then top-p (the smallest set of most likely
tokens whose mass reaches top_p; the most likely token is always kept), renormalised.
Speculative sampling is lossless with respect to this p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 disables), got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[N, V] logits -> [N, V] float32 probabilities (p)."""
    if sampling.is_greedy:
        raise ValueError("greedy decoding has no sampling distribution; use argmax")
    scaled = logits.float() / sampling.temperature
    vocab = scaled.shape[-1]
    if 0 < sampling.top_k < vocab:
        # Exactly top_k tokens survive, even when logits tie at the boundary.
        keep = torch.zeros_like(scaled, dtype=torch.bool).scatter(-1, scaled.topk(sampling.top_k, dim=-1).indices, True)
        scaled = scaled.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.double().sort(dim=-1, descending=True, stable=True)
        # Mass strictly before each token: a token is kept while that mass is < top_p,
        # so the first token is always kept and the kept set just reaches top_p.
        # NOTE: the relative slack stops rounding (0.5 + 0.3 -> 0.7999999999999999) from
        # admitting one extra token when a prefix reaches top_p exactly (as on the device).
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        keep_sorted = mass_before < sampling.top_p * (1.0 - 1e-9)
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
