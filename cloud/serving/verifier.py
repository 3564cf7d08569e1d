"""Verification on one replica, free of any transport: open sessions, verify batches.

``Verifier.step`` is the whole round for a batch of sessions:

1. each session becomes a ``Row`` (its pending token + drafts, its sampling, its round);
2. the backend runs ONE target forward over all rows and applies the accept rule;
3. stop tokens / length / context limits are applied to each raw verdict, which commits the round (``commit_round``).

Each session's cache is rolled back to its committed length at the start of its next forward
(the row's ``cache_len``), so a rejected draft costs nothing to undo.

A step with no drafts is a plain decoding step: that is how ``Generate`` (cloud-only
generation, the baseline) shares the same batched forward as speculative sessions.

A backend that batches by itself (``continuous``: vLLM) is called per session instead: each round
is ``verify_now`` as it arrives, and ``Generate`` is the engine's own streaming decode
(``decode_stream``), committed token by token through the same ``commit_round``.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import AsyncIterator, Callable, cast

from edgespec.cloud.serving.accept import Row
from edgespec.cloud.serving.backend import BackendError, ContinuousBackend, LocalBackend, ProcessBackend, make_backend
from edgespec.cloud.serving.engine import PREFILL_CHUNK
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.cloud.serving.session import DraftBlock, Limits, OpenRequest, SessionState, Verdict, commit_round, open_session
from edgespec.edge.params import Finish

log = logging.getLogger("ray.serve")


@dataclass
class VerifyItem:
    state: SessionState
    block: DraftBlock | None  # None: a decoding step with no drafts

    @property
    def drafts(self) -> list[int]:
        return self.block.tokens if self.block else []

    def row(self) -> Row:
        state = self.state
        if state.cache_key is None:
            raise RuntimeError("verifying a session whose cache was freed")
        return Row(
            key=state.cache_key,
            cache_len=len(state.committed) - 1,
            tokens=[state.pending] + self.drafts,
            mode=state.mode,
            sampling=state.spec.sampling,
            round_no=state.next_round,
            q=self.block.q if self.block else None,
            parents=self.block.parents if self.block else None,
        )


def _cache_key(state: SessionState) -> int:
    if state.cache_key is None:
        raise RuntimeError("the session's cache was freed")
    return state.cache_key


class Verifier:
    def __init__(self, config: VerifierConfig, backend=None):
        """``backend``: where the target runs; by default the one ``config`` asks for."""
        self.config = config
        self.backend = backend if backend is not None else make_backend(config)
        info = self.backend.info
        self.limits = Limits(
            vocab_size=info.vocab_size,
            max_context=info.max_context,
            max_k=config.max_k,
            max_new_tokens=config.max_new_tokens,
            default_max_new_tokens=config.default_max_new_tokens,
            tokenizer_fingerprint=info.tokenizer_fingerprint,
            max_tree_tokens=config.max_tree_tokens if info.can_verify_trees else 0,
            modes=info.modes,
            backend=config.backend,
        )
        self._keys = itertools.count(1)

    def admit(self, request: OpenRequest, *, generate: bool = False) -> SessionState:
        """Validates the request and names the session's cache; touches no model (any thread)."""
        state = open_session(request, self.limits, generate=generate)
        state.cache_key = next(self._keys)
        return state

    def prefill_jobs(self, state: SessionState) -> list[Callable[[], None]]:
        """The model-thread jobs that build the session's cache over the prompt (all but its last
        token), one forward each: between them the replica verifies other sessions' drafts."""
        prefix, backend, key = state.committed[:-1], cast(LocalBackend | ProcessBackend, self.backend), _cache_key(state)
        jobs: list[Callable[[], None]] = [partial(backend.open, key, [])]
        for start in range(0, len(prefix), PREFILL_CHUNK):
            jobs.append(partial(backend.extend, key, prefix[start : start + PREFILL_CHUNK]))
        return jobs

    def start(self, request: OpenRequest, *, generate: bool = False) -> SessionState:
        """``admit`` and every prefill job, in this thread."""
        state = self.admit(request, generate=generate)
        for job in self.prefill_jobs(state):
            job()
        return state

    def finish(self, state: SessionState) -> None:
        """Frees the session's KV cache."""
        if state.cache_key is not None:
            self.backend.close(state.cache_key)
            state.cache_key = None

    @property
    def continuous(self) -> bool:
        """The backend batches sessions' requests itself: no model thread, no batch scheduler."""
        return getattr(self.backend, "continuous", False)

    @property
    def _continuous(self) -> ContinuousBackend:
        return cast(ContinuousBackend, self.backend)

    async def open_now(self, state: SessionState) -> None:
        """A continuous backend's prefill: the prompt (all but its last token) into its cache."""
        await self._continuous.open(_cache_key(state), state.committed[:-1])

    async def verify_now(self, item: VerifyItem) -> Verdict:
        """One session's round on a continuous backend, committed as ``step`` commits a batch's."""
        started = time.perf_counter()
        outcome = await self._continuous.verify(item.row(), item.state.committed[:-1])
        return self._commit_batch([item], [outcome], (time.perf_counter() - started) * 1000.0)[0]

    async def decode_stream(self, state: SessionState) -> AsyncIterator[Verdict]:
        """A Generate stream on a continuous backend: the engine decodes on its own, and each token
        it streams is committed as a round with no drafts (stop tokens, length and context apply)."""
        budget = min(state.max_new_tokens - state.generated, state.context_room)
        last = time.perf_counter()
        stream = self._continuous.decode(_cache_key(state), state.committed, state.spec.sampling, budget, state.stop_ids)
        try:
            async for tokens in stream:
                now = time.perf_counter()
                step_ms, last = (now - last) * 1000.0 / len(tokens), now
                for token in tokens:
                    round_no = state.next_round
                    _, token, finish = commit_round(state, [], 0, token)
                    yield Verdict(round_no, 0, token, finish, verify_ms=step_ms)
                    if state.finished:
                        return
            raise BackendError(f"the engine's stream ended after {state.generated} tokens, before the request finished")
        finally:
            await stream.aclose()  # ends the engine's request when the stream stops early

    def step(self, items: list[VerifyItem]) -> list[Verdict | Exception]:
        """Verifies a batch. When the batch forward fails, each session is verified alone, so
        a row that fails (its result is the exception) fails only its own session."""
        started = time.perf_counter()
        try:
            raw = cast(LocalBackend | ProcessBackend, self.backend).verify([item.row() for item in items])
        except Exception as exc:
            if len(items) == 1:
                raise
            log.warning("a batch of %d failed (%r): verifying its sessions one by one", len(items), exc)
            return [self._step_alone(item) for item in items]
        verify_ms = (time.perf_counter() - started) * 1000.0
        return list(self._commit_batch(items, raw, verify_ms))

    def _step_alone(self, item: VerifyItem) -> Verdict | Exception:
        try:
            return self.step([item])[0]
        except Exception as exc:
            return exc

    def _commit_batch(self, items: list[VerifyItem], raw, verify_ms: float) -> list[Verdict]:
        verdicts = []
        for item, outcome in zip(items, raw):
            state = item.state
            round_no = state.next_round
            if outcome.path is not None:  # a tree: the accepted path is what the round emits
                emitted, every_draft = [item.drafts[i] for i in outcome.path], False
            else:
                emitted, every_draft = item.drafts, item.block is not None and outcome.accepted == len(item.drafts)
            accepted, token, finish = commit_round(state, emitted, outcome.accepted, outcome.next_token)
            path = None if outcome.path is None else outcome.path[:accepted]
            prob = outcome.next_prob if (accepted, token) == (outcome.accepted, outcome.next_token) else None
            verdict = Verdict(round_no, accepted, token, finish, batch_size=len(items), verify_ms=verify_ms,
                              accepted_path=path, next_prob=prob)
            state.last_block, state.last_verdict = item.block, verdict
            state.last_full = every_draft and finish is Finish.NONE
            verdicts.append(verdict)
        return verdicts

    def shutdown(self) -> None:
        self.backend.shutdown()
