"""Draft-side sampling: logits -> a distribution q -> a (possibly truncated) sparse q -> a token.

Terms (notation of Leviathan et al. 2023: p = target, q = draft):

- *processed distribution*: softmax(logits / temperature) after top-k and top-p filtering,
  renormalised. Temperature 0 means greedy: the distribution is a point mass on the argmax.
- *sparse q*: the processed distribution cut to its ``top_n`` most likely tokens and
  renormalised (``SparseDist``). This is what the edge sends to the verifier.

The rule that keeps exact sampling lossless: **the edge samples from exactly the
distribution it sends**. ``sample`` therefore draws from a ``SparseDist``, never from the
full distribution it was cut from.

Two kinds of randomness: exact and token modes draw from a generator per round (``round_rng``);
coupled mode draws with exponentials keyed by (seed, absolute position, token id)
(``PositionDraws``, ``position_exponentials``: a splitmix64 hash, docs/protocol.md "Coupled
sampling"), the same ones the verifier races p with (``coupled_token``), so the text depends on
the seed and the prompt, not on where rounds begin and end.

Numpy only: this module runs on the device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Union

import numpy as np

from edgespec.edge.params import SamplingParams

# A fixed salt keeps draft-side streams apart from other users of the same (seed, round).
_ROUND_SALT = 0xED6E


@dataclass(frozen=True)
class SparseDist:
    """A distribution over a subset of the vocabulary; tokens not listed have probability 0.

    Entries are ordered by decreasing probability (ties by token id)."""

    token_ids: np.ndarray  # [m] int32
    probs: np.ndarray  # [m] float64, sums to 1

    def __post_init__(self) -> None:
        if self.token_ids.ndim != 1 or self.token_ids.shape != self.probs.shape or self.token_ids.size == 0:
            raise ValueError(
                f"SparseDist needs 1-D token_ids and probs of the same non-zero length, "
                f"got {self.token_ids.shape} and {self.probs.shape}"
            )

    def prob_of(self, token_id: int) -> float:
        hit = np.flatnonzero(self.token_ids == token_id)
        return float(self.probs[hit[0]]) if hit.size else 0.0


def probs_from_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The processed distribution: temperature, then top-k, then top-p, renormalised.

    logits: [V] any float dtype. Returns [V] float64 summing to 1. Greedy params give a point
    mass on the argmax (the first one on ties, as ``np.argmax``).
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array [V], got shape {logits.shape}")
    if np.isnan(logits).any():
        raise ValueError("logits contain NaN; the draft model produced invalid output")
    if not np.isfinite(logits.max()):
        raise ValueError("logits have no finite maximum (all -inf, or +inf present)")
    if params.is_greedy:
        out = np.zeros_like(logits)
        out[int(np.argmax(logits))] = 1.0
        return out
    # NOTE: subtracting the max before exp keeps every term in (0, 1]: no overflow, and the
    # max itself contributes exp(0) = 1, so the sum cannot underflow to 0.
    scaled = (logits - logits.max()) / params.temperature
    weights = np.exp(scaled)
    if 0 < params.top_k < weights.size:
        # argpartition keeps exactly top_k entries even when values tie at the boundary.
        drop = np.argpartition(-weights, params.top_k - 1)[params.top_k :]
        weights[drop] = 0.0
    probs = weights / weights.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        mass_before = np.cumsum(probs[order]) - probs[order]
        # Keep a token while the mass above it is still short of top_p: the smallest prefix
        # reaching top_p. The first token always has mass_before == 0 < top_p, so one survives.
        # NOTE: the relative slack stops rounding (0.5 + 0.3 -> 0.7999999999999999) from
        # admitting one extra token when a prefix reaches top_p exactly.
        keep = order[mass_before < params.top_p * (1.0 - 1e-9)]
        filtered = np.zeros_like(probs)
        filtered[keep] = probs[keep]
        probs = filtered / filtered.sum()
    return probs


def truncate_top_n(probs: np.ndarray, n: int) -> SparseDist:
    """The ``n`` most likely tokens of ``probs`` [V], renormalised. ``n <= 0``: every nonzero entry."""
    probs = np.asarray(probs, dtype=np.float64)
    nonzero = np.flatnonzero(probs > 0.0)
    if nonzero.size == 0:
        raise ValueError("probs has no positive entry")
    # Sort by decreasing probability, ties by token id (lexsort's last key is the primary one).
    order = nonzero[np.lexsort((nonzero, -probs[nonzero]))]
    if n > 0:
        order = order[:n]
    kept = probs[order]
    return SparseDist(token_ids=order.astype(np.int32), probs=kept / kept.sum())


def point_mass(token_id: int) -> SparseDist:
    """q = 1 on ``token_id``: a context lookup's proposal as a draft distribution.

    The verifier then accepts with probability p(x) and, on a reject, samples the residual
    max(0, p - q), which is p with x removed: lossless, like any q the token was drawn from."""
    return SparseDist(token_ids=np.array([token_id], dtype=np.int32), probs=np.ones(1))


def mix_point_mass(dist: SparseDist, token_id: int, weight: float, top_n: int = 0) -> SparseDist:
    """q = weight * (point mass on ``token_id``) + (1 - weight) * ``dist``, within ``top_n`` entries.

    Sampling from the result and sending it keeps exact mode lossless. Where ``token_id`` is
    not among ``dist``'s entries and ``dist`` already holds ``top_n``, ``dist`` is first cut
    to its ``top_n - 1`` most likely tokens (renormalised), so q never lists more than ``top_n``.
    ``weight`` 1 is ``point_mass``; 0 is ``dist`` itself (then ``token_id`` need not be listed).
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1], got {weight!r}")
    if weight == 1.0:
        return point_mass(token_id)
    if weight == 0.0:
        return dist
    ids, probs = dist.token_ids, dist.probs
    if not np.any(ids == token_id) and 0 < top_n <= ids.size:
        ids, probs = ids[: top_n - 1], probs[: top_n - 1] / probs[: top_n - 1].sum()
    mixed = dict(zip(ids.tolist(), ((1.0 - weight) * probs).tolist()))
    mixed[int(token_id)] = mixed.get(int(token_id), 0.0) + weight
    order = sorted(mixed, key=lambda t: (-mixed[t], t))  # decreasing probability, ties by id
    weights = np.array([mixed[t] for t in order])
    return SparseDist(token_ids=np.array(order, dtype=np.int32), probs=weights / weights.sum())


def round_rng(seed: int, round_no: int) -> np.random.Generator:
    """A generator determined by (seed, round): a retried round draws the same numbers."""
    if seed < 0 or round_no < 0:
        raise ValueError(f"seed and round_no must be >= 0, got seed={seed}, round_no={round_no}")
    return np.random.default_rng([int(seed), int(round_no), _ROUND_SALT])


def sample(dist: SparseDist, rng: "np.random.Generator | PositionDraws", position: int | None = None) -> int:
    """One token drawn from exactly ``dist``: with a generator, by inverting its CDF with one
    uniform draw; with ``PositionDraws``, by the exponential race of absolute ``position``
    (coupled mode: the token the verifier is likeliest to emit there)."""
    if isinstance(rng, PositionDraws):
        return rng.sample(dist, position)
    cdf = np.cumsum(dist.probs)
    # NOTE: scale u by the total instead of assuming it is 1.0, so rounding in the sum can
    # never push u past the last bucket; side="right" never lands on a zero-probability entry.
    u = rng.random() * cdf[-1]
    index = min(int(np.searchsorted(cdf, u, side="right")), cdf.size - 1)
    return int(dist.token_ids[index])


# ---- position-keyed draws (coupled mode) --------------------------------------------------
#
# One Gumbel vector per absolute position P (the index in the whole sequence, prompt included),
# derived from (seed, P, token id) by a counter-based hash that any language reproduces bit for
# bit (docs/protocol.md "Coupled sampling"). The draft samples x_P = argmax_v q_P(v) / E_P(v)
# and the verifier's token is t_P = argmax_v p_P(v) / E_P(v), with E = -log(u) ~ Exp(1): the
# exponential race, i.e. the Gumbel-max trick argmax log p + g with g = -log(E). Every emitted
# token is t_P, so the output depends on (seed, prompt, target) only, never on round boundaries.

_MASK64 = (1 << 64) - 1
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
SPLITMIX_M1 = 0xBF58476D1CE4E5B9
SPLITMIX_M2 = 0x94D049BB133111EB
_U53 = 2.0**-53
_HASH_CHUNK = 8192  # token ids hashed at once: a few arrays of this size stay in cache
_U_MIN = 2.0**-54  # NOTE: u = 0 (one chance in 2^53) is moved here, so E = -log(u) stays finite


def mix64(x: int) -> int:
    """splitmix64's output for state ``x`` (Steele et al. 2014): ``x + gamma``, then the finaliser."""
    z = (int(x) + SPLITMIX_GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * SPLITMIX_M1) & _MASK64
    z = ((z ^ (z >> 27)) * SPLITMIX_M2) & _MASK64
    return z ^ (z >> 31)


def _mix64_array(x: np.ndarray) -> np.ndarray:
    """``mix64`` over a uint64 array, in place (numpy's uint64 arithmetic wraps modulo 2^64)."""
    z = x
    z += np.uint64(SPLITMIX_GAMMA)
    shifted = z >> np.uint64(30)
    z ^= shifted
    z *= np.uint64(SPLITMIX_M1)
    np.right_shift(z, np.uint64(27), out=shifted)
    z ^= shifted
    z *= np.uint64(SPLITMIX_M2)
    np.right_shift(z, np.uint64(31), out=shifted)
    z ^= shifted
    return z


def position_key(seed: int, position: int) -> int:
    """The key of one absolute position: mix64(mix64(seed) XOR position)."""
    if not 0 <= seed <= _MASK64 or position < 0:
        raise ValueError(f"seed must be in [0, 2^64) and position >= 0, got seed={seed}, position={position}")
    return mix64(mix64(seed) ^ int(position))


def position_uniforms(seed: int, position: int, token_ids: np.ndarray) -> np.ndarray:
    """u(seed, position, v) in (0, 1) for each token id v: the top 53 bits of mix64(key XOR v).

    token_ids: [m] non-negative ints. Returns [m] float64."""
    bits = np.asarray(token_ids).astype(np.uint64)  # a copy: hashed in place
    bits ^= np.uint64(position_key(seed, position))
    bits = _mix64_array(bits)
    bits >>= np.uint64(11)
    u = bits.astype(np.float64)
    u *= _U53  # exact: a 53-bit integer times a power of two
    # NOTE: u < 1 always; only u = 0 (one chance in 2^53) would make E infinite: moved to _U_MIN.
    return np.maximum(u, _U_MIN, out=u)


def position_exponentials(seed: int, position: int, token_ids: np.ndarray) -> np.ndarray:
    """E(seed, position, v) = -log u ~ Exp(1), one per token id: [m] float64, all > 0."""
    token_ids = np.asarray(token_ids)
    if token_ids.size > _HASH_CHUNK:
        # NOTE: a full vocabulary (262k ids) hashed in cache-sized pieces takes half the time.
        out = np.empty(token_ids.size)
        for start in range(0, token_ids.size, _HASH_CHUNK):
            out[start : start + _HASH_CHUNK] = position_exponentials(seed, position, token_ids[start : start + _HASH_CHUNK])
        return out
    u = position_uniforms(seed, position, token_ids)
    np.log(u, out=u)
    return np.negative(u, out=u)


def race(weights: np.ndarray, exponentials: np.ndarray) -> int:
    """The index of argmax weights / exponentials (the first on ties): a sample from weights,
    normalised or not, when the exponentials are iid Exp(1). Zero weights never win unless
    every weight is zero."""
    return int(np.argmax(np.asarray(weights, dtype=np.float64) / exponentials))


def coupled_token(probs: np.ndarray, seed: int, position: int) -> int:
    """t_P: the token at ``position`` for the full distribution ``probs`` [V] (token id = index).

    The verifier's rule in coupled mode (cloud-only streaming too); kept here, numpy only, so
    device tests and ports can check themselves against it. Only tokens with probs > 0 are
    hashed: the argmax is the same, ties (first index) included."""
    probs = np.asarray(probs, dtype=np.float64)
    positive = probs > 0.0
    if positive.all():  # no top-k / top-p cut: race the whole vocabulary, no gathers
        return race(probs, position_exponentials(seed, position, _token_ids(probs.size)))
    support = np.flatnonzero(positive)
    if support.size == 0:
        raise ValueError("probs has no positive entry")
    return int(support[race(probs[support], position_exponentials(seed, position, support))])


@functools.lru_cache(maxsize=4)
def _token_ids(vocab_size: int) -> np.ndarray:
    ids = np.arange(vocab_size, dtype=np.uint64)
    ids.flags.writeable = False  # shared between calls
    return ids


@dataclass(frozen=True)
class PositionDraws:
    """The device's coupled draws: ``sample(dist, rng, position)`` with this as ``rng`` draws the
    token at absolute ``position`` from ``dist`` with that position's exponentials, the ones the
    verifier races p with. One object serves every round: nothing depends on round numbers."""

    seed: int

    def sample(self, dist: SparseDist, position: int | None) -> int:
        if dist.token_ids.size == 1:
            return int(dist.token_ids[0])  # a point mass needs no draw (and no position)
        if position is None:
            raise ValueError("coupled draws need the absolute position of the drafted token")
        return int(dist.token_ids[race(dist.probs, position_exponentials(self.seed, position, dist.token_ids))])



# What a drafter samples with: a round's generator (exact and token modes), or the coupled
# position draws (one object for every round).
Draws = Union[np.random.Generator, PositionDraws]
