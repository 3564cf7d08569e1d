"""The accept rule of speculative decoding, as pure functions over tensors.

Notation (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding";
Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling"):

- p: the target distribution at a position (after temperature / top-k / top-p);
- q: the draft distribution the drafted token was sampled from;
- drafted tokens x_1..x_k; the target is run once over them and yields p_1..p_{k+1}.

Per round the verifier emits n + 1 tokens:

- accepted tokens: the first n drafted tokens that pass the test;
- a recovered token: after the first rejection (position n+1), a token drawn from the
  residual distribution norm(max(0, p_{n+1} - q_{n+1}));
- a bonus token: when all k drafts are accepted, a token drawn from p_{k+1}.

Invariant: every emitted token follows the target distribution p exactly, whatever q is.
In greedy mode the emitted tokens are exactly the target's argmax tokens.

Three modes:

- greedy: accept while x_i == argmax p_i; draws no random numbers.
- exact sampling: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)).
- token-only sampling: q is unknown on the server, so it is taken as a point mass on the
  drafted token: accept with probability p_i(x_i); on rejection draw from p_i with x_i removed
  (the residual of a point mass). Lossless too, with lower acceptance.

Randomness comes only from the per-row ``torch.Generator`` passed in, drawn in a fixed order
(k uniforms, then |V| exponentials), so a round re-verified with the same seed gets the same
verdict regardless of which other sessions share its batch.
"""

from __future__ import annotations

import torch


def verify_greedy(
    draft_tokens: torch.Tensor,  # [B, K] int64, padded past each row's num_drafts
    target_logits: torch.Tensor,  # [B, K+1, V]
    num_drafts: torch.Tensor,  # [B] int64, 0 <= k_b <= K
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: returns (accepted [B], next_token [B]).

    accepted_b is the length of the longest prefix of the drafts equal to the target's
    argmax; next_token_b is the target's argmax at the first position after it (the
    correction on a mismatch, the bonus token when all drafts matched).
    """
    batch, max_k = draft_tokens.shape
    target_tokens = target_logits.argmax(dim=-1)  # [B, K+1]
    positions = torch.arange(max_k, device=draft_tokens.device)
    in_range = positions[None, :] < num_drafts[:, None]  # [B, K]
    matches = (draft_tokens == target_tokens[:, :max_k]) & in_range
    # cumprod keeps 1 only up to the first mismatch: the accepted prefix.
    accepted = matches.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [B]
    next_token = target_tokens.gather(1, accepted[:, None]).squeeze(1)
    return accepted, next_token


def draw_from(weights: torch.Tensor, exponentials: torch.Tensor) -> int:
    """Samples an index with probability proportional to ``weights`` [V].

    NOTE: the exponential race argmax(w / Exp(1)) needs no normalisation, so an
    unnormalised residual max(0, p - q) can be sampled without dividing by its
    (possibly tiny) mass; zero weights never win.
    """
    return int((weights / exponentials).argmax())


def verify_sampling(
    draft_tokens: torch.Tensor,  # [B, K] int64
    draft_probs: torch.Tensor | None,  # [B, K, V] q, or None for token-only mode
    target_probs: torch.Tensor,  # [B, K+1, V] p
    num_drafts: torch.Tensor,  # [B] int64
    generators: list[torch.Generator],  # one per row, seeded per session and round
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling: returns (accepted [B], next_token [B]).

    With ``draft_probs`` it is the exact rule (accept with min(1, p/q), recover from
    max(0, p - q)); without, the token-only rule (q = point mass on the drafted token).
    """
    batch, max_k = draft_tokens.shape
    vocab = target_probs.shape[-1]
    p_x = target_probs[:, :max_k].gather(2, draft_tokens[:, :, None]).squeeze(2)  # [B, K]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)
    else:
        q_x = draft_probs.gather(2, draft_tokens[:, :, None]).squeeze(2)
    accepted = torch.zeros(batch, dtype=torch.int64)
    next_token = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        k = int(num_drafts[b])
        uniforms = torch.rand(k, generator=generators[b], dtype=torch.float64)
        exponentials = torch.empty(vocab, dtype=torch.float64).exponential_(generator=generators[b])
        # Accept x_i iff u_i < p(x_i) / q(x_i), written without a division.
        # NOTE: q(x) = 0 (a token the draft could not have sampled) always rejects,
        # and p(x) = 0 always rejects because the comparison is strict.
        passed = (uniforms * q_x[b, :k].double() < p_x[b, :k].double()) & (q_x[b, :k] > 0)
        n = int(passed.to(torch.int64).cumprod(0).sum()) if k else 0
        accepted[b] = n
        if n == k:
            weights = target_probs[b, k].double()  # bonus token from p_{k+1}
        else:
            if draft_probs is None:
                residual = target_probs[b, n].double().clone()
                residual[draft_tokens[b, n]] = 0.0
            else:
                residual = (target_probs[b, n].double() - draft_probs[b, n].double()).clamp_min(0.0)
            # NOTE: the residual can vanish only when p == q up to rounding, in which
            # case rejection had probability ~0; fall back to p rather than sample nothing.
            weights = residual if residual.sum() > 0 else target_probs[b, n].double()
        next_token[b] = draw_from(weights, exponentials)
    return accepted, next_token


def round_generator(seed: int, round_no: int) -> torch.Generator:
    """The generator for one session round: deterministic in (seed, round)."""
    # A multiplicative mix keeps nearby (seed, round) pairs far apart in seed space.
    mixed = (int(seed) * 0x9E3779B97F4A7C15 + int(round_no) * 0xBF58476D1CE4E5B9 + 0xED5EC) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)
