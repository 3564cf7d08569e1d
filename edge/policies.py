"""The client's policies, each behind a small interface the driver (``edgespec.edge.driver``)
calls at named points. None of them sends a message or changes what is committed: they decide
sizes, paths and waits, and learn from what the rounds measured.

    path        ``planner.Planner``      first_path, should_switch        which path, when to switch
    k           ``policy.KPolicy``       next_k (block_k)                 drafts in the next block
    send-ahead  ``depth()``              fill                             blocks kept in flight
    trees       ``tree_leaves(k)``       before a fresh block             runner-up leaves riding along
    retries     ``transport.Retries``    after a failed attempt           again (after how long, where) or raise
    learning    ``after_round``, ``after_ahead``: after each committed verdict and each block
                sent ahead whose fate is known (the k policy and the planner learn from both)
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.edge.params import GenerationParams, Mode
from edgespec.edge.planner import Planner
from edgespec.edge.policy import KPolicy, make_policy
from edgespec.edge.types import ServerInfo


def path_mode(params: GenerationParams) -> str:
    """The planner's mode for a request: auto only with adaptive k and ``speculate="auto"``."""
    if params.speculate is False:
        return "cloud_only"
    return "auto" if params.k == "auto" and params.speculate == "auto" else "speculative"


@dataclass(frozen=True)
class RoundTiming:
    """What one committed round measured (ms), as the policies learn it."""

    k: int  # drafts of the block's chain
    accepted: int
    tokens: int  # committed by the round
    draft_ms: float | None  # None: the drafting also fed the context (no per-token time)
    wait_ms: float  # send (or the previous verdict, if later) -> verdict
    wall_ms: float  # previous verdict -> verdict
    forward_ms: float  # the replica's forward + accept time
    ahead: bool  # the block was sent ahead: its wait is no round trip


class Policies:
    """One request's policies; the planner may be shared across requests (it lives on the client)."""

    def __init__(self, params: GenerationParams, info: ServerInfo, planner: Planner | None = None):
        self.planner = planner or Planner(path_mode(params))
        # Adaptive k chooses by the planner's acceptance by position, so it reaches the k the
        # planner's forecast assumes (and the first probing blocks say what longer ones commit).
        # Until this request has measured a round trip, its rounds wait what the planner measured
        # of earlier ones (``after_round``: the first round's wait is not one), and a draft costs
        # what the device's drafting measured on them: priced at a fixed 0.5 ms against the
        # demo draft's 0.06-0.1, each request's first rounds drafted k 4-12 where 16 paid (loopback).
        self.k: KPolicy = make_policy(params.k, k_max=info.max_k, tokens=self.planner.expected_tokens,
                                      round_prior=self.planner.wait_ms, draft_ms=self.planner.drafting_ms())
        self.send_ahead = params.send_ahead if info.send_ahead else 1
        self.planner.use_send_ahead(self.send_ahead)  # (the planner may be shared: each request says its own)
        self.tree = params.tree if params.mode is Mode.GREEDY else 0
        self.max_tree_tokens = info.max_tree_tokens

    def block_k(self, limit: int) -> int:
        return self.k.next_k(limit)

    def tree_leaves(self, k: int) -> int:
        """Runner-up leaves to add to a fresh block of ``k`` drafts (greedy only; 0: a chain)."""
        return max(0, min(self.tree, self.max_tree_tokens - k))

    def depth(self) -> int:
        """Blocks to keep in flight (1: never send ahead)."""
        return self.planner.depth() if self.send_ahead == "auto" else int(self.send_ahead)

    def after_round(self, timing: RoundTiming) -> None:
        wait_ms = None if timing.ahead else timing.wait_ms  # (a block sent ahead waited behind another)
        # The block that rode with the Open (no per-token drafting time: its drafting fed the
        # context) also waited for the replica's prefill, which is no round trip of k drafts:
        # fitted, a 70 ms first wait at k = 6 beside an 18 ms second one at k = 5 made each
        # draft cost 50 ms, and a sampled request drafted k = 1 for its first dozen rounds (no
        # round at a longer k came to correct the line). (The planner leaves it out likewise.)
        self.k.update(timing.k, timing.accepted, draft_ms=timing.draft_ms,
                      wait_ms=None if timing.draft_ms is None else wait_ms)
        if timing.draft_ms is not None:
            self.planner.record_drafting(timing.draft_ms, timing.k)
        self.planner.record_round(wall_ms=timing.wall_ms, wait_ms=wait_ms,
                                  forward_ms=timing.forward_ms, tokens=timing.tokens, k=timing.k)
        if timing.ahead:
            self.planner.record_ahead(True)

    def after_ahead(self, valid: bool, count: int = 1) -> None:
        for _ in range(count):
            self.planner.record_ahead(valid)
