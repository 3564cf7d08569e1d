"""Applying the accept rule to a verified batch: rows grouped by mode, padded, one call each.

Greedy rows go to ``verify_greedy`` on the raw logits; sampling rows get p from their own
temperature / top-k / top-p (rows differ), their q densified from the wire's sparse form (exact
mode) or left out (token mode), and a generator seeded by (session seed, round).
"""

from __future__ import annotations

import torch

from edgespec.cloud.accept import round_generator, verify_greedy, verify_sampling
from edgespec.cloud.backend import Row
from edgespec.cloud.sampling import Sampling, target_probs


def accept_rows(rows: list[Row], logits: list[torch.Tensor]) -> list[tuple[int, int]]:
    """logits[i]: [len(rows[i].tokens), V]. Returns (accepted, next token) per row, in order."""
    out: list[tuple[int, int]] = [(0, 0)] * len(rows)
    for mode in ("greedy", "exact", "token"):
        group = [i for i, row in enumerate(rows) if row.mode == mode]
        if group:
            results = _accept(mode, [rows[i] for i in group], [logits[i] for i in group])
            for i, result in zip(group, results):
                out[i] = result
    return out


def _accept(mode: str, rows: list[Row], logits: list[torch.Tensor]) -> list[tuple[int, int]]:
    batch = len(rows)
    max_k = max(len(row.drafts) for row in rows)
    vocab = logits[0].shape[-1]
    drafts = torch.zeros(batch, max_k, dtype=torch.long)
    num_drafts = torch.tensor([len(row.drafts) for row in rows], dtype=torch.long)
    for b, row in enumerate(rows):
        drafts[b, : len(row.drafts)] = torch.tensor(row.drafts, dtype=torch.long)
    if mode == "greedy":
        padded = torch.full((batch, max_k + 1, vocab), float("-inf"))
        for b, row_logits in enumerate(logits):
            padded[b, : row_logits.shape[0]] = row_logits
        counts, tokens = verify_greedy(drafts, padded, num_drafts)
        return list(zip(counts.tolist(), tokens.tolist()))
    p = torch.zeros(batch, max_k + 1, vocab)
    q = torch.zeros(batch, max_k, vocab, dtype=torch.float64) if mode == "exact" else None
    for b, (row, row_logits) in enumerate(zip(rows, logits)):
        sampling = Sampling(temperature=row.temperature, top_k=row.top_k, top_p=row.top_p, seed=row.seed)
        p[b, : row_logits.shape[0]] = target_probs(row_logits, sampling)
        if q is not None:
            for i, (ids, probs) in enumerate(row.q):
                q[b, i, torch.tensor(ids, dtype=torch.long)] = torch.tensor(probs, dtype=torch.float64)
    generators = [round_generator(row.seed, row.round_no) for row in rows]
    counts, tokens = verify_sampling(drafts, q, p, num_drafts, generators)
    return list(zip(counts.tolist(), tokens.tolist()))
