"""A drafter with no model: every draft comes from the context (lookup-only speculation).

What context lookup alone is worth, measured against the draft model (``lookup="only"``):
each draft is the token that followed the longest earlier occurrence of the current suffix
(``edgespec.edge.lookup``); where no suffix of ``min_n`` or more tokens occurred before, the
token that followed the last token's previous occurrence; where there is none, the last
token again. A round therefore always drafts, and a round whose first draft is rejected
still commits the target's token, as a cloud step does: one forward, one token.

In the sampling modes each draft's q is a point mass on it (``point_mass``): exact mode
accepts it with probability p(x) and recovers from p without x, so the output follows p.
It implements the ``Drafter`` protocol (``edgespec.edge.drafter``), as ``DraftModel`` does.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from edgespec.edge.draft import checked_token_ids
from edgespec.edge.drafter import Drafter, Proposal
from edgespec.edge.lookup import LookupConfig, lookup_next
from edgespec.edge.params import SamplingParams
from edgespec.edge.sampling import Draws, PositionDraws, SparseDist, point_mass, sample

BIGRAM = LookupConfig(max_n=1, min_n=1)  # the fallback: what followed the last token before


class LookupDraft:
    """Drafts from the context only; ``model`` (a draft model) lends its manifest and tokenizer,
    never runs."""

    def __init__(self, model: Drafter, config: LookupConfig | None = None):
        self.model = model
        self.manifest, self.tokenizer = model.manifest, model.tokenizer
        self.vocab_size = model.vocab_size
        self.eos_token_ids = model.eos_token_ids
        self.config = config or LookupConfig()
        self.tokens: list[int] = []

    def fork(self) -> "LookupDraft":
        return LookupDraft(self.model, self.config)

    def reset(self, context_ids: Sequence[int]) -> None:
        self.tokens = checked_token_ids(context_ids, self.vocab_size, "context_ids")

    def append(self, token_ids: Sequence[int]) -> None:
        self.tokens.extend(checked_token_ids(token_ids, self.vocab_size, "token_ids"))

    def rollback_to(self, n: int) -> None:
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"rollback_to({n}) is outside [0, {len(self.tokens)}] (the current context length)")
        del self.tokens[n:]

    def guess(self, lookup: LookupConfig | None = None) -> int:
        """The next token from the context alone (see the module docstring)."""
        found = lookup_next(self.tokens, lookup or self.config)
        if found is None:
            found = lookup_next(self.tokens, BIGRAM)
        return self.tokens[-1] if found is None else found

    def propose(
        self,
        k: int,
        *,
        sampling: SamplingParams | None = None,
        rng: Draws | None = None,
        top_n: int = 0,
        lookup: LookupConfig | None = None,
        alternatives: bool = False,
        lookup_weight: float = 1.0,
    ) -> Proposal:
        """k drafts from the context, appended to ``tokens``; sampling: q is a point mass on each."""
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if not self.tokens:
            raise ValueError("the context is empty: call reset(prompt_ids) with at least one token first")
        if alternatives:
            raise ValueError("a lookup-only draft has no runner-up tokens: tree drafts need the draft model")
        draws = None  # sampled: the round's draws
        if sampling is not None and not sampling.is_greedy:
            if rng is None:
                raise ValueError("sampling needs the round's generator (rng)")
            draws = rng
        started = time.perf_counter()
        drafts: list[int] = []
        q: list[SparseDist] = []
        for _ in range(k):
            token = self.guess(lookup)
            if draws is not None:
                dist = point_mass(token)
                sample(dist, draws)  # NOTE: drawn anyway, so the round's stream matches a model draft's
                q.append(dist)
            self.tokens.append(token)
            drafts.append(token)
        return Proposal(tokens=drafts, q=q if draws is not None else None, draft_ms=(time.perf_counter() - started) * 1e3)

    def observe(self, token_ids: Sequence[int], lookup: LookupConfig | None = None) -> list[int]:
        """Appends streamed tokens; returns what would have been drafted at each."""
        predicted = []
        for token in checked_token_ids(token_ids, self.vocab_size, "token_ids"):
            predicted.append(self.guess(lookup))
            self.tokens.append(token)
        return predicted

    def observe_chances(self, token_ids: Sequence[int], *, sampling: SamplingParams, lookup: LookupConfig | None = None,
                        lookup_weight: float = 1.0, draws: PositionDraws | None = None, top_n: int = 0,
                        target_probs: Sequence[float | None] | None = None) -> list[float]:
        """Sampled: appends streamed tokens; per token, the chance a draft there would have been
        accepted. A point mass on the guess is accepted exactly when the target's sample is it
        (in every mode: a point mass is drawn without ``draws``; ``target_probs`` changes
        nothing: min(1, q(t) / p(t)) is that same 1 or 0)."""
        return [1.0 if guess == token else 0.0 for guess, token in zip(self.observe(token_ids, lookup), token_ids)]
