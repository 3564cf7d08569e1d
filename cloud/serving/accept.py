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

Four modes:

- greedy: accept while x_i == argmax p_i; draws no random numbers.
- exact sampling: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)).
- token-only sampling: q is unknown on the server, so it is taken as a point mass on the
  drafted token: accept with probability p_i(x_i); on rejection draw from p_i with x_i removed
  (the residual of a point mass). Lossless too, with lower acceptance.
- coupled sampling (``verify_coupled``): the token at absolute position P is always
  t_P = argmax_v p_P(v) / E_P(v), with E_P(v) ~ Exp(1) keyed by (seed, P, v) alone
  (``edgespec.edge.sampling.position_exponentials``); x_i is accepted iff x_i == t_P, the
  first mismatch emits t_P (the recovered token), all accepted emit t_{P+k} (the bonus). No q
  on the wire: the device drew x_i = argmax q/E_P with the same E_P.

Randomness in exact and token modes comes only from the per-row ``torch.Generator`` passed in,
drawn in a fixed order (k uniforms, then |V| exponentials), so a round re-verified with the same
seed gets the same verdict regardless of which other sessions share its batch. In coupled mode
it comes only from (seed, position): the verdicts do not depend on rounds either.

This module also holds what turns a verified batch into those calls (``accept_rows``): the
per-session ``Row`` of a batch, the target distribution p under each row's temperature /
top-k / top-p (``target_probs``, the same semantics as the device's
``edgespec.edge.sampling.probs_from_logits``), padding, and grouping rows by mode. Pure
functions over tensors: no model, no transport, no global RNG.
"""


from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from edgespec.edge.params import Mode, SamplingParams
from edgespec.edge.sampling import coupled_token

Q = list[tuple[list[int], list[float]]]


@dataclass(frozen=True)
class Row:
    """One session's part of a verification batch."""

    key: int  # the session's cache on the backend
    cache_len: int  # trim the cache to this many tokens before feeding
    tokens: list[int]  # the pending token, then the drafts
    mode: Mode
    sampling: SamplingParams
    round_no: int
    q: Q | None = None  # exact mode: per draft, normalised sparse q (token ids, probs)
    parents: list[int] | None = None  # a tree (greedy): each draft's parent draft, -1 = the pending token

    @property
    def drafts(self) -> list[int]:
        return self.tokens[1:]

    @property
    def position(self) -> int:
        """The absolute position (index in prompt + generated) of the row's first draft, which
        is the position of the token the row emits first: the cache holds every committed
        token but the pending one, so it is ``cache_len + 1``."""
        return self.cache_len + 1

    @property
    def tree(self) -> list[int] | None:
        """The parents of the row's new tokens (pending token first, parent -1), or None for a chain."""
        if self.parents is None:
            return None
        return [-1] + [0 if parent < 0 else parent + 1 for parent in self.parents]


class Outcome(NamedTuple):
    """A row's raw verdict: ``accepted`` drafts (for a tree: the nodes of ``path``), then ``next_token``."""

    accepted: int
    next_token: int
    path: list[int] | None = None  # trees: the accepted drafts' indices, root first
    # Coupled rows (Generate's steps among them): p(next_token), what the target's distribution at
    # its position gave the token it emitted (``GenerateResponse.token_probs``); None otherwise.
    next_prob: float | None = None


def verify_greedy(
    draft_tokens: list[int],  # [k] x_1 .. x_k
    target_tokens: list[int],  # [k + 1] argmax p_1 .. argmax p_{k+1}
) -> tuple[int, int]:
    """Greedy verification: returns (accepted, next_token).

    accepted is the length of the longest prefix of the drafts equal to the target's argmax;
    next_token is the target's argmax at the first position after it (the correction on a
    mismatch, the bonus token when all drafts matched). Over argmax ids as Python ints: a
    round's k is small, and a packed batch takes one argmax for all its rows (``greedy_rows``).
    """
    accepted = 0
    for draft, best in zip(draft_tokens, target_tokens):
        if draft != best:
            break
        accepted += 1
    return accepted, target_tokens[accepted]


def verify_greedy_tree(
    draft_tokens: list[int],  # [n] the tree's tokens
    parents: list[int],  # [n] each token's parent index, -1 = the pending token; parents come first
    target_tokens: list[int],  # [n + 1] argmax p after the pending token (index 0), then after each node
) -> tuple[list[int], int]:
    """Greedy verification of a tree: returns (the accepted path's node indices, next token).

    From the pending token, follow the child whose token equals the target's argmax after its
    parent, as long as there is one; the next token is the target's argmax after the last node
    of the path. Siblings carry distinct tokens (the session checks), so the path is unique,
    and the emitted tokens are exactly the target's greedy tokens, as for a chain.
    """
    children: dict[int, dict[int, int]] = {}
    for node, (token, parent) in enumerate(zip(draft_tokens, parents)):
        children.setdefault(parent, {})[token] = node
    path: list[int] = []
    at = -1  # the pending token
    for _ in range(len(draft_tokens) + 1):  # NOTE: a path visits each node once at most
        wanted = target_tokens[at + 1]
        node = children.get(at, {}).get(wanted)
        if node is None or node <= at:
            return path, wanted
        path.append(node)
        at = node
    return path, target_tokens[at + 1]


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
    # The only per-row work: each row's own seeded draws, k uniforms then |V| exponentials.
    uniforms = torch.ones(batch, max_k, dtype=torch.float64)
    exponentials = torch.empty(batch, vocab, dtype=torch.float64)
    for b in range(batch):
        k = int(num_drafts[b])
        uniforms[b, :k] = torch.rand(k, generator=generators[b], dtype=torch.float64)
        exponentials[b].exponential_(generator=generators[b])
    p = target_probs.double()
    p_x = p[:, :max_k].gather(2, draft_tokens[:, :, None]).squeeze(2)  # [B, K]
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.double().gather(2, draft_tokens[:, :, None]).squeeze(2)
    in_range = torch.arange(max_k)[None, :] < num_drafts[:, None]  # [B, K]
    # Accept x_i iff u_i < p(x_i) / q(x_i), written without a division.
    # NOTE: q(x) = 0 (a token the draft could not have sampled) always rejects,
    # and p(x) = 0 always rejects because the comparison is strict.
    passed = (uniforms * q_x < p_x) & (q_x > 0) & in_range
    accepted = passed.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [B]
    rows = torch.arange(batch)
    p_next = p[rows, accepted]  # [B, V]: p at the first rejected position, or p_{k+1}
    weights = p_next  # the bonus token where every draft was accepted
    rejected = accepted < num_drafts
    if max_k and bool(rejected.any()):
        at = accepted.clamp_max(max_k - 1)
        if draft_probs is None:  # residual of a point mass: p with the drafted token removed
            residual = p_next.clone()
            residual[rows, draft_tokens[rows, at]] = 0.0
        else:
            residual = (p_next - draft_probs.double()[rows, at]).clamp_min(0.0)
        # NOTE: the residual can vanish only when p == q up to rounding, in which case
        # rejection had probability ~0; fall back to p rather than sample nothing.
        residual = torch.where((residual.sum(-1) > 0)[:, None], residual, p_next)
        weights = torch.where(rejected[:, None], residual, p_next)
    # The exponential race argmax(w / Exp(1)) samples w without normalising it (see draw_from).
    next_token = (weights / exponentials).argmax(dim=-1)
    return accepted, next_token


def verify_coupled(
    draft_tokens: list[int],  # [k] x_P .. x_{P+k-1}
    target_probs: np.ndarray,  # [k+1, V] p_P .. p_{P+k} (float64)
    seed: int,
    position: int,  # P: the absolute position of the first draft
) -> tuple[int, int]:
    """Coupled verification: returns (accepted, next_token).

    The target's token at each position j is t_j = argmax_v p_j(v) / E_{P+j}(v) (exponentials
    keyed by seed and absolute position: an exact sample from p_j, independent of everything
    before P + j). Drafts are accepted while x_j == t_j; next_token is t at the first
    mismatch, or the bonus t_{P+k}. Every emitted token is a t, so the output is the target's
    own seeded sample, however the positions were split into rounds. Positions after the first
    mismatch are never hashed.
    """
    for j in range(len(draft_tokens) + 1):
        token = coupled_token(target_probs[j], seed, position + j)
        if j == len(draft_tokens) or draft_tokens[j] != token:
            return j, token
    raise AssertionError("unreachable: the loop returns at j == k")


def round_generator(seed: int, round_no: int) -> torch.Generator:
    """The generator for one session round: deterministic in (seed, round)."""
    # A multiplicative mix keeps nearby (seed, round) pairs far apart in seed space.
    mixed = (int(seed) * 0x9E3779B97F4A7C15 + int(round_no) * 0xBF58476D1CE4E5B9 + 0xED5EC) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


# ---- the target distribution p -------------------------------------------------------------


def target_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
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


# ---- a verified batch -> the accept rule ------------------------------------------------------


class NonFiniteLogits(ValueError):
    """The target produced NaN or inf logits for a row: no verdict can be drawn from them."""


def accept_rows(rows: list[Row], logits: list[torch.Tensor], packed: torch.Tensor | None = None) -> list[Outcome]:
    """logits[i]: [len(rows[i].tokens), V]. Returns each row's Outcome, in order.

    ``packed`` [sum n_i, V]: the same logits, the rows one after the other (what a packed forward
    returns). With it a batch of greedy rows takes one argmax and one finiteness check for the
    whole batch, then compares ints (``greedy_rows``); the result is the same.

    Raises NonFiniteLogits when a row's logits are not all finite (the verifier then verifies
    the batch's sessions one by one, so that only that session fails).
    """
    if packed is not None and all(row.mode is Mode.GREEDY for row in rows):
        return greedy_rows(rows, packed)
    for row, row_logits in zip(rows, logits):
        # NOTE: argmax over NaN picks the NaN; softmax of an inf is NaN: refuse, do not guess.
        if not bool(torch.isfinite(row_logits).all()):
            raise NonFiniteLogits(f"the target produced NaN or inf logits for session {row.key}")
    out: list[Outcome] = [Outcome(0, 0)] * len(rows)
    for i, row in enumerate(rows):
        if row.mode is Mode.GREEDY or row.parents is not None:  # trees are greedy only (the session checks)
            out[i] = greedy_outcome(row, logits[i].argmax(dim=-1).tolist())
    for mode in Mode:
        group = [i for i, row in enumerate(rows) if row.mode == mode and mode is not Mode.GREEDY and row.parents is None]
        if group:
            if mode is Mode.COUPLED:
                for i in group:
                    out[i] = coupled_outcome(rows[i], logits[i])
                continue
            results = _accept(mode, [rows[i] for i in group], [logits[i] for i in group])
            for i, (accepted, token) in zip(group, results):
                out[i] = Outcome(accepted, token)
    return out


def coupled_outcome(row: Row, logits: torch.Tensor) -> Outcome:
    """A coupled row's verdict (``verify_coupled``), with the probability p gave its token."""
    probs = target_probs(logits, row.sampling).double().cpu().numpy()
    accepted, token = verify_coupled(row.drafts, probs, row.sampling.resolved_seed, row.position)
    return Outcome(accepted, token, None, float(probs[accepted, token]))


def greedy_rows(rows: list[Row], packed: torch.Tensor) -> list[Outcome]:
    """Greedy verification of a packed batch (see ``accept_rows``): one argmax for the batch,
    then each row's ``greedy_outcome``."""
    # NOTE: a row's max is NaN when any of its logits is NaN (max propagates NaN) and inf when one
    # is +inf: checking the T maxima finds every logit that could decide a greedy verdict, for a
    # fraction of a full isfinite pass. A -inf logit (a token ruled out) decides nothing here.
    # Refused batches are retried row by row (Verifier.step), where the full check runs.
    best, ids = packed.max(dim=-1)
    if not bool(torch.isfinite(best).all()):
        raise NonFiniteLogits("the target produced NaN or inf logits in this batch")
    ids = ids.tolist()
    out: list[Outcome] = []
    start = 0
    for row in rows:
        out.append(greedy_outcome(row, ids[start : start + len(row.tokens)]))
        start += len(row.tokens)
    return out


def greedy_outcome(row: Row, target_tokens: list[int]) -> Outcome:
    """A greedy row's verdict (a chain's or a tree's) from the target's argmax ids after the
    pending token, then after each draft."""
    if row.parents is not None:
        path, token = verify_greedy_tree(row.drafts, row.parents, target_tokens)
        return Outcome(len(path), token, path)
    return Outcome(*verify_greedy(row.drafts, target_tokens))


def _accept(mode: Mode, rows: list[Row], logits: list[torch.Tensor]) -> list[tuple[int, int]]:
    batch = len(rows)
    max_k = max(len(row.drafts) for row in rows)
    vocab = logits[0].shape[-1]
    drafts = torch.zeros(batch, max_k, dtype=torch.long)
    num_drafts = torch.tensor([len(row.drafts) for row in rows], dtype=torch.long)
    for b, row in enumerate(rows):
        drafts[b, : len(row.drafts)] = torch.tensor(row.drafts, dtype=torch.long)
    p = torch.zeros(batch, max_k + 1, vocab)
    q = torch.zeros(batch, max_k, vocab, dtype=torch.float64) if mode is Mode.EXACT else None
    for b, (row, row_logits) in enumerate(zip(rows, logits)):
        p[b, : row_logits.shape[0]] = target_probs(row_logits, row.sampling)
        if q is not None:
            if row.q is None:
                raise ValueError("an exact-mode row without q")  # session.py checks every exact block has it
            for i, (ids, probs) in enumerate(row.q):
                q[b, i, torch.tensor(ids, dtype=torch.long)] = torch.tensor(probs, dtype=torch.float64)
    generators = [round_generator(row.sampling.resolved_seed, row.round_no) for row in rows]
    counts, tokens = verify_sampling(drafts, q, p, num_drafts, generators)
    return list(zip(counts.tolist(), tokens.tolist()))
