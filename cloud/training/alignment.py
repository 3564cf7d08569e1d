"""How well a draft q matches a target p, as pure functions over logits.

Notation (Leviathan et al. 2023): p = target, q = draft, both over the same vocabulary.

- KL(p || q) = sum_x p(x) (log p(x) - log q(x)): the distillation loss. Forward KL puts weight
  where the target does, which is what verification rewards.
- alpha = E[sum_x min(p(x), q(x))] = 1 - TV(p, q): the expected acceptance rate of one drafted
  token under exact speculative sampling at temperature 1.
- greedy agreement = P(argmax q == argmax p): the acceptance rate under greedy verification.

All functions take logits shaped [..., vocab] and reduce over every leading position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Mean over positions of KL(p_T || q_T), scaled by T^2 so gradients keep their size (Hinton et al.)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    log_p = F.log_softmax(p_logits.float() / temperature, dim=-1)
    log_q = F.log_softmax(q_logits.float() / temperature, dim=-1)
    p = log_p.exp()
    # NOTE: a masked target logit (-inf, e.g. after top-k) gives p = 0 and log p = -inf;
    # 0 * -inf is nan, but the term is 0 by definition, so select it explicitly.
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
    return terms.sum(-1).mean() * temperature**2


def alpha(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of sum_x min(p(x), q(x)) at temperature 1."""
    p = F.softmax(p_logits.float(), dim=-1)
    q = F.softmax(q_logits.float(), dim=-1)
    return torch.minimum(p, q).sum(-1).mean()


def greedy_agreement(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Fraction of positions where argmax q == argmax p."""
    return (p_logits.argmax(-1) == q_logits.argmax(-1)).float().mean()


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss (nats); ``labels`` has the shape of ``logits`` without the vocab dim."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))
