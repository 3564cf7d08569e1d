"""The draft run over a cloud-only stream, off the event loop.

What the draft would have proposed at each streamed token tells the planner what speculation
would commit here (``planner.Shadowed``: per token, the chance a draft there would have been
accepted: greedy, a hit; sampled, ``Drafter.observe_chances``), and its time on the draft
thread is its own cost. Tokens are run over ``SHADOW_BATCH`` at a time, one forward each; a
start on the cloud-only path has the draft read the prompt first. Between looks
(``planner.shadow_wanted``) it rests: the tokens it skips are kept, and the next look catches
the draft up on them in the same forward, so it sees the context as speculation would.
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
from edgespec.edge.planner import Planner, Shadowed, shadow_wanted

SHADOW_BATCH = 8  # streamed tokens the draft is run over at once


class Shadow:
    """``observe`` each streamed message's tokens (after committing them); ``finish`` at the end."""

    def __init__(self, drafter: Drafter, draft_thread: Executor, planner: Planner, committed: list[int], *,
                 lookup: LookupConfig | None, sampling: SamplingParams | None = None,
                 lookup_weight: float = 1.0, draws: PositionDraws | None = None, top_n: int = 0,
                 clock: Callable[[], float] = time.perf_counter):
        self.drafter, self.draft_thread, self.planner = drafter, draft_thread, planner
        self.lookup, self.clock = lookup, clock
        self.position, self.gap = 0, False  # streamed tokens seen; whether a rest skipped some since the last look
        self.sampling = sampling if sampling is not None and not sampling.is_greedy else None
        self.lookup_weight, self.draws, self.top_n = lookup_weight, draws, top_n  # coupled: exact hits (``observe_chances``)
        self.pending: asyncio.Future | None = None
        self.buffer: list[int] = []  # streamed tokens the draft is to run over next (``SHADOW_BATCH``)
        self.buffer_probs: list[float | None] = []  # sampled: each buffered token's p(t), None where unknown
        self.skipped: list[int] = []  # streamed tokens a rest skipped: the next look catches up on them
        # in_step: the draft follows the committed tokens (but for ``skipped`` and ``buffer``);
        # fresh: it has not read this generation's context yet (a start on the cloud-only path);
        # neither: it fell behind for good (its context limit), the next speculative segment resets it.
        self.in_step = drafter.tokens[: len(committed)] == committed
        self.fresh = not self.in_step
        if self.in_step:
            drafter.rollback_to(len(committed))

    def observe(self, tokens: list[int], committed: list[int], max_context: int,
                probs: list[float] | None = None) -> None:
        """``tokens`` were just streamed and committed (``committed`` ends with them); ``probs``:
        the target's p(t) of each, one per token (``generate_tokens``), None where the stream sent none."""
        if not self.in_step and not self.fresh:
            return
        if len(committed) + 1 >= max_context:
            self._flush(committed[: len(committed) - len(tokens)])
            self.in_step = self.fresh = False  # the draft falls behind; the next speculative segment resets it
            return
        self.position += len(tokens)
        if not shadow_wanted(self.planner.state, self.planner.config, self.position - 1):
            self._flush(committed[: len(committed) - len(tokens)])  # (the look so far counts)
            if not self.fresh:
                self.skipped.extend(tokens)
            self.gap = True
            return
        self.buffer.extend(tokens)
        self.buffer_probs.extend(probs if probs is not None else [None] * len(tokens))  # (one per token: ``generate_tokens``)
        if len(self.buffer) >= SHADOW_BATCH:
            self._flush(committed)

    def _flush(self, committed: list[int]) -> None:
        """Runs the draft over the buffered tokens (``committed`` ends with them) on the draft
        thread; the planner observes what it saw."""
        tokens, self.buffer = self.buffer, []
        probs, self.buffer_probs = self.buffer_probs, []
        if not tokens:
            return
        context, skipped = None, self.skipped
        if self.fresh:  # everything before these tokens, in one batched forward
            context, skipped = committed[: -len(tokens)], []
        self.skipped, self.fresh, self.in_step = [], False, True
        after_gap, self.gap = self.gap, False
        # One draft thread: observations run in the order the tokens came.
        future = asyncio.get_running_loop().run_in_executor(self.draft_thread, self._look, context, skipped, tokens, probs)

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                self.in_step = self.fresh = False
                return
            seen, draft_ms = f.result()
            if context is not None or skipped:
                draft_ms = None  # (it read the context too: a one-off, not the shadow's cost per token)
            chances = [float(p == t) for p, t in zip(seen, tokens)] if self.sampling is None else seen
            self.planner.observe(Shadowed(tuple(chances), draft_ms, after_gap))

        future.add_done_callback(done)
        self.pending = future

    def _look(self, context: list[int] | None, skipped: list[int], tokens: list[int],
              probs: list[float | None]) -> tuple[list, float]:
        """(greedy: the draft's guess at each token; sampled: each token's chance), and the ms it
        took. ``context`` (a fresh start) or ``skipped`` (after a rest) is fed in the same forward."""
        started = self.clock()
        if context is not None:
            self.drafter.reset(context)
        elif skipped:
            self.drafter.append(skipped)
        if self.sampling is None:
            seen: list = self.drafter.observe(tokens, self.lookup)
        else:
            seen = self.drafter.observe_chances(tokens, sampling=self.sampling, lookup=self.lookup,
                                                lookup_weight=self.lookup_weight, draws=self.draws, top_n=self.top_n,
                                                target_probs=probs)
        return seen, (self.clock() - started) * 1000

    async def finish(self, committed: list[int]) -> None:
        """Waits for the draft thread (the next segment uses the draft), and leaves the draft's
        context at ``committed`` where it followed the stream (what it skipped appended)."""
        if self.in_step or self.fresh:
            self._flush(committed)  # (what it has seen of the stream counts, and the draft keeps up)
        if self.pending is not None:
            await asyncio.gather(self.pending, return_exceptions=True)
        if self.in_step and self.skipped:
            self.drafter.append(self.skipped)  # (the draft thread is idle: nothing runs there now)
            self.skipped = []
