"""Continuing a batch of prompts with a causal LM, keeping the logits of every position.

Distillation trains on target-generated text (what greedy verification actually checks) and
the offline acceptance simulation compares draft guesses against target continuations; both
need the target's logits at each position, which generation produces anyway.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def continue_prompts(
    model,
    prompts: torch.Tensor,
    new_tokens: int,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    keep_logits: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Extends ``prompts`` [batch, length] by ``new_tokens`` tokens.

    temperature 0 is greedy (no random numbers drawn); otherwise tokens are sampled from
    softmax(logits / temperature) with ``generator``.

    Returns (ids [batch, length + new_tokens], logits [batch, length + new_tokens - 1, vocab]),
    where logits[:, i] is the model's prediction for ids[:, i + 1]; logits is None when not
    ``keep_logits`` (only the last position's are held at a time: a corpus needs only the ids).
    """
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    out = model(input_ids=prompts, use_cache=True)
    cache = out.cache
    last = out.logits[:, -1].float()
    logits = [out.logits.float()] if keep_logits else None
    ids = [prompts]
    for step in range(new_tokens):
        if temperature == 0:
            token = last.argmax(-1, keepdim=True)
        else:
            probs = torch.softmax(last / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator)
        ids.append(token)
        if step + 1 < new_tokens:  # the last token's prediction is not needed
            out = model(input_ids=token, cache=cache, use_cache=True)
            last = out.logits[:, -1].float()
            if keep_logits:
                logits.append(out.logits.float())
    return torch.cat(ids, dim=1), (torch.cat(logits, dim=1) if keep_logits else None)
