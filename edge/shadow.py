"""The draft run over a cloud-only stream, off the event loop.

What the draft would have proposed at each streamed token tells the planner the tokens per
round speculation would commit here (greedy: ``Planner.record_shadow``, hits; sampled:
``Planner.record_shadow_sampled``, the chance each streamed token would have been accepted), and
its time on the draft thread is the shadow's own cost; the draft's cache keeps in step with the
stream. A generation that starts cloud-only has the draft read the prompt first (one batched
forward, as a speculative start does). While the planner judges the draft unpromising it rests
(``Planner.shadow_wanted``) and a look starts it from the last ``SHADOW_CONTEXT`` tokens; the
next speculative segment resets it. Everything it needs is passed in: it never reads the run.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from typing import Callable

from edgespec.edge.drafter import Drafter
from edgespec.edge.lookup import LookupConfig
from edgespec.edge.params import SamplingParams
from edgespec.edge.sampling import PositionDraws
from edgespec.edge.planner import Planner

SHADOW_CONTEXT = 16  # tokens of recent context the shadow re-reads when a look follows a rest


class Shadow:
    """``observe`` each streamed message's tokens (after committing them); ``finish`` at the end."""

    def __init__(self, drafter: Drafter, draft_thread: Executor, planner: Planner, committed: list[int], *,
                 block_k: Callable[[], int], lookup: LookupConfig | None, sampling: SamplingParams | None = None,
                 lookup_weight: float = 1.0, draws: PositionDraws | None = None, top_n: int = 0,
                 clock: Callable[[], float] = time.perf_counter):
        self.drafter, self.draft_thread, self.planner = drafter, draft_thread, planner
        self.block_k, self.lookup, self.clock = block_k, lookup, clock
        self.sampling = sampling if sampling is not None and not sampling.is_greedy else None
        self.lookup_weight, self.draws, self.top_n = lookup_weight, draws, top_n  # coupled: exact hits (``observe_chances``)
        self.pending: asyncio.Future | None = None
        self.synced = drafter.tokens[: len(committed)] == committed
        # Context a look re-reads before the streamed tokens when the draft is out of step: all
        # of it at the start (a generation that starts cloud-only: the draft has not read the
        # prompt), the last SHADOW_CONTEXT tokens after a rest; None: fell behind for good.
        self.reread: int | None = None if self.synced else 0
        if self.synced:
            drafter.rollback_to(len(committed))

    def observe(self, tokens: list[int], committed: list[int], max_context: int) -> None:
        """``tokens`` were just streamed and committed (``committed`` ends with them)."""
        if len(committed) + 1 >= max_context:
            self.synced, self.reread = False, None  # the draft falls behind; the next speculative segment resets it
            return
        if not self.planner.shadow_wanted(len(tokens)):
            self.synced, self.reread = False, SHADOW_CONTEXT
            return
        context = None
        if not self.synced:
            if self.reread is None:
                return  # fell behind: the next speculative segment resets it
            before = committed[: -len(tokens)]
            context = before[-self.reread :] if self.reread else before  # (the draft reads it in one batched forward)
            self.synced, self.reread = True, None
        k = self.block_k()
        # One draft thread: observations run in the order the tokens came.
        future = asyncio.get_running_loop().run_in_executor(self.draft_thread, self._look, context, list(tokens))

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                self.synced, self.reread = False, None
                return
            seen, draft_ms = f.result()
            if context is not None:
                draft_ms = None  # (it re-read the context too: a one-off, not the shadow's cost per token)
            if self.sampling is None:
                self.planner.record_shadow([p == t for p, t in zip(seen, tokens)], k, draft_ms=draft_ms)
            else:
                self.planner.record_shadow_sampled(seen, k, draft_ms=draft_ms)

        future.add_done_callback(done)
        self.pending = future

    def _look(self, context: list[int] | None, tokens: list[int]) -> tuple[list, float]:
        """(greedy: the draft's guess at each token; sampled: each token's chance), and the ms it took."""
        started = self.clock()
        if context is not None:
            self.drafter.reset(context)
        if self.sampling is None:
            seen: list = self.drafter.observe(tokens, self.lookup)
        else:
            seen = self.drafter.observe_chances(tokens, sampling=self.sampling, lookup=self.lookup,
                                                lookup_weight=self.lookup_weight, draws=self.draws, top_n=self.top_n)
        return seen, (self.clock() - started) * 1000

    async def finish(self, committed: list[int]) -> None:
        """Waits for the draft thread (the next segment uses the draft); marks the shadow out of
        step when the draft no longer follows ``committed``."""
        if self.pending is not None:
            await asyncio.gather(self.pending, return_exceptions=True)
        if self.synced and self.drafter.tokens != committed[: len(self.drafter.tokens)]:
            self.synced = False
