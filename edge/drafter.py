"""What the generation loop needs of a drafter: the ``Drafter`` protocol, which the draft model
(``DraftModel``) and the lookup-only drafter (``LookupDraft``) both implement.

A drafter holds a context (``tokens``) and proposes drafts after it. The loop keeps the context
equal to the committed tokens plus the drafts in flight: ``propose`` appends its drafts,
``rollback_to`` cuts them off again, ``append`` adds the verifier's tokens, ``reset`` starts
over. Every setting of a proposal is a keyword (``DraftSettings`` holds a request's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from tokenizers import Tokenizer

from edgespec.edge.lookup import LookupConfig
from edgespec.edge.manifest import DraftManifest
from edgespec.edge.params import SamplingParams
from edgespec.edge.sampling import Draws, PositionDraws, SparseDist


@dataclass
class Proposal:
    tokens: list[int]  # d1..dk
    q: list[SparseDist] | None  # the distribution each draft was sampled from; None when greedy
    draft_ms: float  # wall time of the k forwards and the sampling
    # Greedy with ``alternatives``: per draft, (the runner-up token, how sure the draft was of
    # its choice: the model's probability of it). Where context lookup chose the draft, the
    # runner-up is the model's own argmax.
    alternatives: list[tuple[int, float]] | None = None


@dataclass(frozen=True)
class DraftSettings:
    """A request's drafting settings, passed to ``propose`` as keywords (``as_keywords``)."""

    sampling: SamplingParams | None = None  # None: greedy
    top_n: int = 0  # exact mode: q truncated to its top_n tokens (0: all)
    lookup: LookupConfig | None = None  # context lookup (None: off)
    lookup_weight: float = 1.0  # sampling: the lookup's point mass in q

    def as_keywords(self) -> dict:
        return {"sampling": self.sampling, "top_n": self.top_n, "lookup": self.lookup, "lookup_weight": self.lookup_weight}


class Drafter(Protocol):
    manifest: DraftManifest  # the loop reads max_positions, tokenizer_fingerprint
    tokenizer: Tokenizer
    vocab_size: int
    tokens: list[int]
    eos_token_ids: list[int]  # the default stop tokens

    def fork(self) -> "Drafter": ...

    def reset(self, context_ids: Sequence[int]) -> None: ...

    def append(self, token_ids: Sequence[int]) -> None: ...

    def rollback_to(self, n: int) -> None: ...

    def propose(self, k: int, *, sampling: SamplingParams | None = None, rng: Draws | None = None,
                top_n: int = 0, lookup: LookupConfig | None = None, alternatives: bool = False,
                lookup_weight: float = 1.0) -> Proposal: ...

    def observe(self, token_ids: Sequence[int], lookup: LookupConfig | None = None) -> list[int]: ...

    def observe_chances(self, token_ids: Sequence[int], *, sampling: SamplingParams, lookup: LookupConfig | None = None,
                        lookup_weight: float = 1.0, draws: PositionDraws | None = None, top_n: int = 0,
                        target_probs: Sequence[float | None] | None = None) -> list[float]: ...
