"""Drafting blocks for the driver: a fresh block (after the last verdict) or one sent ahead
(after a guessed bonus token), with the round's seeded draws, on the draft thread.

A block drafted ahead uses the seeded draws of its own round, over the context it would have
had if sent after the verdict, so with a fixed k the output equals a run without send-ahead.
Drafting time is read from the run's clock on the draft thread (queueing excluded).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Callable

import numpy as np

from edgespec.edge.drafter import Drafter, DraftSettings, Proposal
from edgespec.edge.lookup import LookupConfig
from edgespec.edge.params import GenerationParams, Mode
from edgespec.edge.protocol import Block
from edgespec.edge.sampling import Draws, PositionDraws, round_rng

GUESS_SALT = 0xB0  # separates the bonus-guess draws from the round's own draws


def draft_settings(params: GenerationParams) -> DraftSettings:
    """What the draft samples q from: p's parameters at the draft's own temperature; lossless in
    every mode (exact sends the point-mass or mixed q the lookup drew from)."""
    greedy = params.mode is Mode.GREEDY
    return DraftSettings(
        sampling=None if greedy else params.draft_sampling,
        top_n=params.top_n if params.mode in (Mode.EXACT, Mode.COUPLED) else 0,
        lookup=LookupConfig() if params.lookup else None,
        lookup_weight=params.lookup_weight,
    )


def add_leaves(block: Block, alternatives: list[tuple[int, float]], count: int) -> None:
    """Turns a chain into a tree: the runner-up of each of the ``count`` least sure drafts joins
    as a leaf, a sibling of that draft (parent: the draft before it, -1 for the first)."""
    chain = len(block.tokens)
    least_sure = sorted(range(chain), key=lambda i: alternatives[i][1])[:count]
    block.parents = [i - 1 for i in range(chain)]
    for i in sorted(least_sure):
        block.tokens.append(alternatives[i][0])
        block.parents.append(i - 1)


class BlockDrafter:
    """Drafts blocks with one drafter on one draft thread, timed by ``clock`` (seconds)."""

    def __init__(self, drafter: Drafter, draft_thread: Executor, params: GenerationParams,
                 clock: Callable[[], float]):
        self.drafter, self.draft_thread, self.clock = drafter, draft_thread, clock
        self.settings = draft_settings(params)
        self.seed, self.coupled = params.resolved_seed, params.mode is Mode.COUPLED

    def rngs(self, round_no: int) -> tuple[Draws | None, Draws | None]:
        """(the generator of the bonus guess before ``round_no``, the generator of its drafts)."""
        if self.settings.sampling is None:
            return None, None
        if self.coupled:  # keyed by position, not round: one for the guess and the drafts
            draws = PositionDraws(self.seed)
            return draws, draws
        return np.random.default_rng([self.seed, round_no, GUESS_SALT]), round_rng(self.seed, round_no)

    def _timed(self, k: int, rng: Draws | None, alternatives: bool = False) -> tuple[Proposal, float]:
        started = self.clock()
        proposal = self.drafter.propose(k, rng=rng, alternatives=alternatives, **self.settings.as_keywords())
        return proposal, (self.clock() - started) * 1000

    async def fresh(self, round_no: int, k: int, *, leaves: int = 0, prefilled: bool = False) -> Block:
        """k drafts after the committed tokens, and ``leaves`` runner-up leaves (a tree)."""
        _, rng = self.rngs(round_no)
        loop = asyncio.get_running_loop()
        proposal, ms = await loop.run_in_executor(self.draft_thread, self._timed, k, rng, leaves > 0)
        block = Block(round_no, proposal.tokens, proposal.q, draft_ms=ms, prefilled=prefilled)
        if leaves > 0:
            if proposal.alternatives is None:
                raise ValueError("a tree needs the drafter's runner-up tokens: greedy drafting with the draft model")
            add_leaves(block, proposal.alternatives, leaves)
        return block

    async def ahead(self, round_no: int, k: int) -> Block:
        """The guessed bonus token of the block before, then k drafts after it, for ``round_no``."""
        guess_rng, rng = self.rngs(round_no)

        def work():
            guess, guess_ms = self._timed(1, guess_rng)
            proposal, ms = self._timed(k, rng)
            return guess, proposal, guess_ms + ms

        guess, proposal, ms = await asyncio.get_running_loop().run_in_executor(self.draft_thread, work)
        return Block(round_no, proposal.tokens, proposal.q, assumed=guess.tokens[0], draft_ms=ms)

    def sync(self, committed: list[int]) -> None:
        """Leaves the drafter's context at ``committed``, keeping whatever cache is still valid."""
        if self.drafter.tokens[: len(committed)] == committed:
            self.drafter.rollback_to(len(committed))
        else:
            self.drafter.reset(committed)
