"""The device-side draft model: an exported ONNX causal LM with its own KV cache.

Terms:

- *context* (``tokens``): every token the draft knows about, committed by the verifier or
  drafted by this model and not yet rolled back.
- *cache* (``cache_len``): the KV cache covers ``tokens[:cache_len]``. Tokens past it are
  *pending*: known, but not yet fed through the model. ``reset`` and ``append`` only add
  pending tokens; ``propose`` feeds them.
- *proposal*: k drafted tokens d1..dk. ``propose(k)`` runs at most k forwards: one over every
  pending token (yielding d1), then one per draft d1..d(k-1). The last draft dk stays pending,
  because the verifier may replace it. A draft that context lookup decides alone needs no
  logits: its forward is skipped and the tokens wait, pending, for the next one.

One round, as the client runs it::

    committed = len(draft.tokens)
    proposal = draft.propose(k)                # tokens == context + d1..dk
    n, t = verifier(proposal)                  # accepted n drafts, then token t
    draft.rollback_to(committed + n)           # O(1): slices the cache arrays
    draft.append([t])

which leaves the draft in the same state (same next proposal) as
``reset(context + d1..dn + [t])``, only without re-feeding the context.

The KV cache is a list of numpy arrays [1, kv_heads, cache_len, head_dim], one key and one
value per layer, in the order of ``manifest.past_inputs``. No torch here: numpy,
onnxruntime and tokenizers only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from edgespec.edge.drafter import Proposal
from edgespec.edge.eos import eos_token_ids
from edgespec.edge.graph import empty_past, open_session, run_graph, verify_graph_files
from edgespec.edge.lookup import LookupConfig, lookup_next
from edgespec.edge.manifest import DraftManifest
from edgespec.edge.params import SamplingParams
from edgespec.edge.sampling import (
    Draws, PositionDraws, SparseDist, mix_point_mass, point_mass, probs_from_logits, round_rng, sample, truncate_top_n,
)
from edgespec.edge.tokenizer import fingerprint, is_current_scheme, legacy_fingerprint, load_tokenizer


@dataclass
class DraftStats:
    """Counters since construction (a request's drafting rate is ``RequestStats.draft_ms_per_token``)."""

    proposals: int = 0
    forwards: int = 0
    fed_tokens: int = 0  # tokens pushed through the model (context prefill included)
    drafted_tokens: int = 0
    draft_ms: float = 0.0


def _runner_up(logits: np.ndarray, chosen: int, model_token: int) -> tuple[int, float]:
    """(the best token other than ``chosen``, the model's probability of ``chosen``)."""
    shifted = np.exp(logits - logits.max())
    probs = shifted / shifted.sum()
    if chosen != model_token:  # lookup overrode the model: its own choice is the alternative
        return model_token, float(probs[chosen])
    top2 = np.argpartition(-logits, 1)[:2]
    other = int(top2[0] if top2[0] != chosen else top2[1])
    return other, float(probs[chosen])


def sampled_q(found: int | None, params: SamplingParams, top_n: int, lookup_weight: float,
              logits: Callable[[], np.ndarray]) -> SparseDist:
    """The q a sampled draft is drawn from: the lookup's point mass where it alone decides
    (``lookup_weight`` 1: ``logits`` is not called, the model need not run), else the model's
    (top_n), mixed with the lookup's point mass where it has a token ``found``."""
    if found is not None and lookup_weight == 1.0:
        return point_mass(found)
    dist = truncate_top_n(probs_from_logits(logits(), params), top_n)
    return dist if found is None else mix_point_mass(dist, found, lookup_weight, top_n)


def exact_chance(q: float, p: float | None) -> float:
    """The chance exact mode accepts a draft from q where the target drew y: ``q`` = q(y) and
    ``p`` = p(y) (``DraftModel.observe_chances``); q(y) alone where p(y) is unknown or not a
    probability a draw could have had (a stream's value is checked, never trusted)."""
    if p is None or not 0.0 < p <= 1.0:  # (NaN fails both comparisons)
        return q
    return min(1.0, q / p)


def checked_token_ids(ids: Sequence[int], vocab_size: int, what: str) -> list[int]:
    """``ids`` as ints, or ValueError naming ``what`` for a non-integer or out-of-vocabulary id."""
    out = []
    for token in ids:
        if not isinstance(token, (int, np.integer)) or isinstance(token, bool):
            raise ValueError(f"{what} must hold integer token ids, got {token!r}")
        if not 0 <= token < vocab_size:
            raise ValueError(f"{what} holds token id {token}, outside this draft's vocabulary [0, {vocab_size})")
        out.append(int(token))
    return out


class DraftModel:
    """An ONNX draft (a directory from ``edgespec export-draft``) that proposes tokens."""

    def __init__(self, model_dir: str | Path, *, threads: int = 1, providers: Sequence[str] | None = None):
        """``providers``: ONNX Runtime execution providers in priority order (default: CPU); one
        this onnxruntime build lacks is refused with the available ones named. The graph is
        checked against the manifest's sha256 first (``DraftIntegrityError``)."""
        if not isinstance(threads, int) or threads < 0:
            raise ValueError(f"threads must be an integer >= 0 (0 lets ONNX Runtime choose), got {threads!r}")
        self.model_dir = Path(model_dir)
        self.manifest: DraftManifest = DraftManifest.load(self.model_dir)
        self.tokenizer: Tokenizer = load_tokenizer(self.model_dir)
        current, recorded = fingerprint(self.model_dir), self.manifest.tokenizer_fingerprint
        if not is_current_scheme(recorded) and legacy_fingerprint(self.tokenizer) == recorded:
            self.manifest.tokenizer_fingerprint = recorded = current  # exported before scheme tok1: same tokenizer
        if current != recorded:
            raise ValueError(
                f"{self.model_dir / 'tokenizer.json'} has fingerprint {current}, but the "
                f"draft was exported with {recorded}; re-export the draft"
            )
        self.vocab_size: int = self.manifest.vocab_size
        # Every end token: the manifest's, and what the directory's own files declare (a draft
        # exported before the full rule, edgespec.edge.eos, recorded fewer).
        self.eos_token_ids: list[int] = list(dict.fromkeys(self.manifest.eos_token_ids + eos_token_ids(self.model_dir, self.vocab_size)))
        verify_graph_files(self.model_dir, self.manifest)
        self.session = self._open_session(threads, providers)
        self.stats = DraftStats()
        self.tokens: list[int] = []
        self.cache_len = 0
        self._past: list[np.ndarray] = []
        self.reset([])

    def fork(self) -> "DraftModel":
        """A draft with its own context and cache that shares this one's ONNX Runtime session.

        Weights are loaded once; ``InferenceSession.run`` is thread-safe, so forks can serve
        concurrent generations.
        """
        clone = object.__new__(DraftModel)
        clone.model_dir, clone.manifest, clone.tokenizer = self.model_dir, self.manifest, self.tokenizer
        clone.vocab_size, clone.session = self.vocab_size, self.session
        clone.eos_token_ids = self.eos_token_ids
        clone.stats = DraftStats()
        clone.tokens, clone.cache_len, clone._past = [], 0, []
        clone.reset([])
        return clone

    def _open_session(self, threads: int, providers: Sequence[str] | None) -> ort.InferenceSession:
        path = self.model_dir / self.manifest.onnx_file
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; the draft directory is incomplete, re-export it")
        session = open_session(path, threads=threads, providers=providers)
        graph_inputs = [i.name for i in session.get_inputs()]
        if sorted(graph_inputs) != sorted(self.manifest.input_names):
            raise ValueError(
                f"{path} has inputs {graph_inputs} but manifest.json lists {self.manifest.input_names}; "
                f"the two files come from different exports"
            )
        return session

    # -- context --------------------------------------------------------------------------

    def reset(self, context_ids: Sequence[int]) -> None:
        """Starts a new context with an empty cache; the context is fed by the next propose."""
        context = self._checked_ids(context_ids, "context_ids")
        self._check_length(len(context), "the context")
        self.tokens = context
        self._trim_cache(0)

    def append(self, token_ids: Sequence[int]) -> None:
        """Extends the context (e.g. with the verifier's token); fed by the next propose."""
        new = self._checked_ids(token_ids, "token_ids")
        self._check_length(len(self.tokens) + len(new), "the context after append")
        self.tokens.extend(new)

    def rollback_to(self, n: int) -> None:
        """Keeps ``tokens[:n]`` and trims the cache to cover at most those tokens (a slice, no copy)."""
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"rollback_to({n}) is outside [0, {len(self.tokens)}] (the current context length)")
        del self.tokens[n:]
        self._trim_cache(min(self.cache_len, n))

    def _trim_cache(self, length: int) -> None:
        if length == 0:
            self._past = empty_past(self.manifest)
        elif length < self.cache_len:
            self._past = [kv[:, :, :length, :] for kv in self._past]
        self.cache_len = length

    # -- drafting -------------------------------------------------------------------------

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
        """Drafts ``k`` tokens after the context and appends them to ``tokens``.

        Greedy (``sampling`` None or temperature 0): argmax, ``q`` is None, ``rng`` unused.
        Sampling: each draft is drawn from ``truncate_top_n(probs_from_logits(logits, sampling), top_n)``
        and that sparse distribution is returned in ``q`` (the verifier needs exactly it).
        ``rng`` defaults to ``round_rng(sampling.seed, stats.proposals)``; pass the session's
        per-round generator to make rounds reproducible.
        ``lookup``: where the context's suffix occurred before (see ``edgespec.edge.lookup``),
        greedy drafts the token that followed it instead of the argmax; sampling draws from
        ``mix_point_mass(model q, that token, lookup_weight, top_n)`` and returns that q. Where
        the lookup alone decides (greedy without ``alternatives``, or ``lookup_weight`` 1) the
        model is not run at that position: its token is fed with the next forward.
        ``alternatives`` (greedy only): also return each position's runner-up (``Proposal``),
        the material of a tree draft.
        """
        self._ready_to_draft(k)
        sampler = None  # sampled drafts: (the parameters, the draws)
        if sampling is not None and not sampling.is_greedy:
            sampler = sampling, (rng if rng is not None else round_rng(sampling.resolved_seed, self.stats.proposals))
        started = time.perf_counter()
        drafts: list[int] = []
        q: list[SparseDist] = []
        runners_up: list[tuple[int, float]] = []
        for _ in range(k):
            found = lookup_next(self.tokens, lookup) if lookup is not None else None
            if sampler is not None:
                # (where the lookup alone decides the model is not run: its tokens wait for the next forward)
                dist = sampled_q(found, sampler[0], top_n, lookup_weight, lambda: self._feed(self.tokens[self.cache_len :])[-1])
                # NOTE: a point mass draws its uniform too: same stream either way. The context is
                # the whole sequence, so len(tokens) is the absolute position (coupled draws).
                token = sample(dist, sampler[1], len(self.tokens))
                q.append(dist)
            else:
                token, runner_up = self._greedy_draft(found, alternatives)
                if runner_up is not None:
                    runners_up.append(runner_up)
            self.tokens.append(token)
            drafts.append(token)
        elapsed_ms = (time.perf_counter() - started) * 1e3
        self.stats.proposals += 1
        self.stats.drafted_tokens += k
        self.stats.draft_ms += elapsed_ms
        return Proposal(tokens=drafts, q=q if sampler is not None else None, draft_ms=elapsed_ms,
                        alternatives=runners_up if alternatives and sampler is None else None)

    def _ready_to_draft(self, k: int) -> None:
        """Checks ``k`` and the context, and leaves a token to feed: the next forward yields logits."""
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if not self.tokens:
            raise ValueError("the context is empty: call reset(prompt_ids) with at least one token first")
        # Positions up to len(tokens) + k - 2 are fed; the last draft is not.
        self._check_length(len(self.tokens) + k - 1, f"the context plus k={k} drafts")
        if self.cache_len == len(self.tokens):
            # Everything is cached (after a rollback into the cache): re-feed the last token,
            # since the cache keeps keys/values, not the logits that follow them.
            self._trim_cache(self.cache_len - 1)

    def _greedy_draft(self, found: int | None, alternatives: bool) -> tuple[int, tuple[int, float] | None]:
        """The next greedy draft (the lookup's token ``found`` where it has one, else the model's
        argmax) and, with ``alternatives``, its runner-up (``_runner_up``)."""
        if found is not None and not alternatives:
            # The lookup alone decides: the model is not run here; the pending tokens wait for
            # the next forward (one forward over several costs about one).
            return found, None
        logits = self._feed(self.tokens[self.cache_len :])[-1]
        model_token = int(np.argmax(logits))
        token = model_token if found is None else found
        return token, _runner_up(logits, token, model_token) if alternatives else None

    def observe(self, token_ids: Sequence[int], lookup: LookupConfig | None = None) -> list[int]:
        """Appends tokens the device did not draft (streamed by the cloud) and returns what greedy
        drafting (with ``lookup``) would have proposed at each of them, from one forward: the
        material of an acceptance estimate while not speculating. The cache keeps up, so
        speculation can resume without a prefill."""
        new = self._checked_ids(token_ids, "token_ids")
        if not new:
            return []
        logits, offset = self._feed_observed(new)
        predicted = []
        for i, token in enumerate(new):
            guess = lookup_next(self.tokens, lookup) if lookup is not None else None
            predicted.append(int(np.argmax(logits[offset + i])) if guess is None else guess)
            self.tokens.append(token)
        return predicted

    def observe_chances(self, token_ids: Sequence[int], *, sampling: SamplingParams, lookup: LookupConfig | None = None,
                        lookup_weight: float = 1.0, draws: PositionDraws | None = None, top_n: int = 0,
                        target_probs: Sequence[float | None] | None = None) -> list[float]:
        """Sampled: appends streamed tokens (as ``observe``) and returns, per token, the chance a
        draft there would have been accepted. q is the draft's as ``propose`` forms it (the
        model's at the draft's temperature, top_n, mixed with the lookup's point mass).

        Coupled mode (``draws``, the request's position draws): exactly 1 or 0. The streamed
        token y at position P is the target's t_P = argmax p/E_P, and a draft there is accepted
        iff it equals t_P; the draft's would have been argmax q/E_P with the same E_P, so the
        device knows: 1 iff its coupled draft from q is y.

        Exact mode, with p(y) from the stream (``target_probs``, ``GenerateResponse.token_probs``;
        None where a token has none): min(1, q(y) / p(y)), whose mean over y ~ p is
        sum_v min(p(v), q(v)), exact mode's acceptance of a draft from q. Without p(y): q(y),
        whose mean is sum_v p(v) q(v), token-only verification's acceptance, a lower bound (on
        the demo pair at T = 0.8, 0.48 where exact mode accepts 0.61: speculation looked slower
        than it is, and a sampled request that streamed seldom came back)."""
        new = self._checked_ids(token_ids, "token_ids")
        if not new:
            return []
        logits, offset = self._feed_observed(new)
        chances = []
        for i, token in enumerate(new):
            guess = lookup_next(self.tokens, lookup) if lookup is not None else None
            dist = sampled_q(guess, sampling, top_n, lookup_weight, lambda: logits[offset + i])
            if draws is not None:
                chances.append(1.0 if draws.sample(dist, len(self.tokens)) == token else 0.0)
            else:
                p = target_probs[i] if target_probs is not None and i < len(target_probs) else None
                chances.append(exact_chance(dist.prob_of(token), p))
            self.tokens.append(token)
        return chances

    def _feed_observed(self, new: list[int]) -> tuple[np.ndarray, int]:
        """One forward that brings the cache up to the context plus ``new`` but its last token;
        returns (logits, offset): ``logits[offset + i]`` is the prediction for ``new[i]``."""
        if not self.tokens:
            raise ValueError("the context is empty: call reset(prompt_ids) with at least one token first")
        self._check_length(len(self.tokens) + len(new), "the context after observe")
        if self.cache_len == len(self.tokens):
            self._trim_cache(self.cache_len - 1)  # the logits after the last token are not cached
        offset = len(self.tokens) - 1 - self.cache_len
        return self._feed(self.tokens[self.cache_len :] + new[:-1]), offset

    def _feed(self, ids: list[int]) -> np.ndarray:
        """One forward over ``ids`` against the cache; extends the cache. Returns logits [n, V]."""
        logits, self._past = run_graph(self.session, self.manifest, ids, self.cache_len, self._past)
        self.cache_len += len(ids)
        self.stats.forwards += 1
        self.stats.fed_tokens += len(ids)
        return logits

    def logits_for_context(self, context_ids: Sequence[int]) -> np.ndarray:
        """Logits [len, V] over ``context_ids`` from an empty cache; leaves the model's state alone."""
        context = self._checked_ids(context_ids, "context_ids")
        if not context:
            raise ValueError("context_ids must hold at least one token")
        self._check_length(len(context), "the context")
        return run_graph(self.session, self.manifest, context, 0, empty_past(self.manifest))[0]

    # -- validation -----------------------------------------------------------------------

    def _checked_ids(self, ids: Sequence[int], what: str) -> list[int]:
        return checked_token_ids(ids, self.vocab_size, what)

    def _check_length(self, length: int, what: str) -> None:
        if length > self.manifest.max_positions:
            raise ValueError(
                f"{what} is {length} tokens, more than the draft's max_positions {self.manifest.max_positions}; "
                f"shorten the prompt or lower k"
            )
