"""The device's generation loop: speculative rounds with send-ahead, cloud-only streaming, and
the switch between them (``Planner``), with resume on a broken stream.

A speculative segment is one Session stream:

1. Open (with every committed token) and, right behind it, the first block: drafting the
   first block overlaps the Open's round trip;
2. keep up to ``depth`` blocks in flight: each block after the first is drafted *ahead*, on the
   assumption that the block before it is accepted whole and its bonus token is the draft's own
   guess (``Draft.ahead``, ``assumed_token``); the verifier verifies such a block only if the
   assumption held, and otherwise answers ``discarded`` without running the model;
3. on each verdict (n accepted, next token t) commit drafts[:n] + [t]. If the next block in
   flight assumed exactly this (n == k and t == its assumed token) it stays valid; otherwise
   every block in flight is stale (their verdicts come back ``discarded`` and are skipped), the
   draft rolls back to the committed tokens and a fresh block goes out for the same round.

A block drafted ahead uses the seeded draws of its own round, over the context it would have
had if sent after the verdict, so with a fixed k the output equals a run without send-ahead.

A cloud-only segment is one Generate stream. The planner ends a segment when the other path is
predicted clearly faster; the next one starts from every committed token, round numbering
continued, so no token is lost or repeated and seeded draws carry on. A broken stream is
resumed the same way (``transport.Retries`` decides how often). When the draft's own context
limit is reached the rest is generated cloud-only.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

import grpc
import numpy as np

from edgespec.edge.errors import status_error
from edgespec.edge.lookup import LookupConfig
from edgespec.edge.lookup_draft import LookupDraft
from edgespec.edge.params import GenerationParams, Mode, served_mode
from edgespec.edge.planner import Path, Planner
from edgespec.edge.policy import make_policy
from edgespec.edge.sampling import PositionDraws, SparseDist, round_rng
from edgespec.edge.stats import RequestStats
from edgespec.edge.transport import ReplicaMoved, Retries, SessionStream, StreamEnded, generate_tokens
from edgespec.edge.types import RoundRecord, ServerInfo
from edgespec.edge.wire import CLOSE_REQUEST, draft_request, finish_name, generate_request, open_request
from edgespec.v1 import speculative_pb2_grpc as pb_grpc

GUESS_SALT = 0xB0  # separates the bonus-guess draws from the round's own draws
RTT_PROBE_INTERVAL_S = 0.5  # while streaming cloud-only: how often the round trip is probed
SHADOW_CONTEXT = 16  # tokens of recent context the shadow re-reads when a look follows a rest


@dataclass
class Block:
    """One drafted block on its way to the verifier."""

    round_no: int
    tokens: list[int]  # the drafts d1..dk
    q: list[SparseDist] | None  # exact mode: the distribution each draft was sampled from
    assumed: int | None  # sent ahead: the bonus token the block before it must emit
    draft_ms: float
    prefilled: bool  # its drafting also fed the context (not a per-token drafting time)
    parents: list[int] | None = None  # a tree: the chain first, then runner-up leaves
    sent_at: float = 0.0
    stale: bool = False  # an assumption it rests on failed: its verdict will be "discarded"

    @property
    def ahead(self) -> bool:
        return self.assumed is not None


class SpeculativeRun:
    """One generation request; iterate ``chunks()`` for the tokens as they are committed."""

    def __init__(
        self,
        stub: pb_grpc.SpeculativeStub,
        draft,
        draft_thread: Executor,
        prompt_ids: list[int],
        params: GenerationParams,
        info: ServerInfo,
        *,
        timeout: float,
        max_retries: int,
        planner: Planner | None = None,
        rtt_probe: Callable[[], Awaitable[float]] | None = None,
    ):
        params = served_mode(params, info.modes)  # an older server: exact instead of coupled
        if params.lookup == "only":
            draft = LookupDraft(draft)  # no draft model: every draft comes from the context
        self.stub, self.draft, self.draft_thread = stub, draft, draft_thread
        self.params, self.info = params, info
        self.timeout, self.max_retries = timeout, max_retries
        self.planner = planner or Planner(path_mode(params))
        self.rtt_probe = rtt_probe
        self.prompt_ids = list(prompt_ids)
        self.committed = list(prompt_ids)
        self.generated: list[int] = []
        self.finish_reason = ""
        self.stats = RequestStats(seed=None if params.is_greedy else params.seed)
        self.rounds: list[RoundRecord] = []
        self.segments: list[tuple[str, int]] = []  # (path, tokens) in the order they were produced
        self.round_no = 0  # the next round of seeded draws (a verification round, or a cloud token)
        self.policy = make_policy(params.k, k_max=info.max_k)
        self.sampling = None if params.mode is Mode.GREEDY else params.sampling
        # What the draft samples q from: p's parameters at the draft's own temperature.
        self.draft_sampling = None if self.sampling is None else params.draft_sampling
        self.top_n = params.top_n if params.mode in (Mode.EXACT, Mode.COUPLED) else 0
        # Lossless in every mode: exact sends the (point-mass or mixed) q the lookup drew from.
        self.lookup = LookupConfig() if params.lookup else None
        stop = params.stop_token_ids
        self.stop_token_ids = list(draft.eos_token_ids if stop is None else stop)
        # The draft can see at most this many positions; past it the cloud finishes alone.
        self.max_context = info.max_context if params.lookup == "only" else min(info.max_context, draft.manifest.max_positions)
        self._last_verdict_at = 0.0

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.generated)

    def _draft_room(self) -> int:
        """Drafts a fresh block may hold: a round commits up to k + 1 tokens the draft must still see."""
        return self.max_context - len(self.committed) - 1

    # ---- the loop over segments ----------------------------------------------------------

    async def chunks(self) -> AsyncIterator[list[int]]:
        started = time.perf_counter()
        retries = Retries(self.max_retries, self.timeout, self.stats, reroute=getattr(self.stub, "reconnect", None))
        path = self.planner.first_path(self.params.max_new_tokens, self.info.max_k)
        try:
            while not self.finish_reason:
                if path is Path.SPECULATIVE and self._draft_room() < 1:
                    path = Path.CLOUD_ONLY  # the draft's context is full: the cloud finishes alone
                segment = self._speculative_segment() if path is Path.SPECULATIVE else self._cloud_segment()
                self.planner.begin(path)
                try:
                    async for tokens in segment:
                        if not self.stats.first_token_s:
                            self.stats.first_token_s = time.perf_counter() - started
                        retries.progress()
                        self._count(path, tokens)
                        yield tokens
                except (grpc.RpcError, asyncio.TimeoutError) as exc:
                    await retries.wait(exc)  # raises the typed error when giving up
                    continue  # the same path again, from every committed token
                if not self.finish_reason and (path is Path.CLOUD_ONLY or self._draft_room() >= 1):
                    path = Path.CLOUD_ONLY if path is Path.SPECULATIVE else Path.SPECULATIVE
                    self.stats.switches += 1
        finally:
            self.stats.wall_s = time.perf_counter() - started

    def _count(self, path: Path, tokens: list[int]) -> None:
        if self.segments and self.segments[-1][0] == path.value:
            self.segments[-1] = (path.value, self.segments[-1][1] + len(tokens))
        else:
            self.segments.append((path.value, len(tokens)))

    # ---- speculation over one Session stream ---------------------------------------------

    async def _speculative_segment(self) -> AsyncIterator[list[int]]:
        stream = SessionStream(self.stub.Session(), self.timeout, self.stats)
        inflight: deque[Block] = deque()
        try:
            # Step 1: Open, and the first block right behind it.
            await stream.send(
                open_request(
                    self.committed, self.params.sampling, self.params.mode, self.draft.manifest.tokenizer_fingerprint,
                    max_new_tokens=self.remaining, stop_token_ids=self.stop_token_ids, first_round=self.round_no,
                )
            )
            if self.draft.tokens[: len(self.committed)] == self.committed:
                self.draft.rollback_to(len(self.committed))  # keeps whatever cache is still valid
            else:
                self.draft.reset(self.committed)
            self._last_verdict_at = time.perf_counter()
            await self._send(stream, inflight, await self._fresh_block(prefilled=True))
            opened = (await stream.receive()).opened
            self.max_context = min(self.max_context, opened.max_context or self.max_context)
            self.stats.replica_ids.append(opened.replica_id)
            while inflight:
                # Step 2: keep the pipeline full with blocks drafted ahead.
                await self._fill(stream, inflight)
                verdict = (await stream.receive()).verdict
                block = inflight.popleft()
                if verdict.round != block.round_no:
                    raise status_error(grpc.StatusCode.INTERNAL, f"verdict for round {verdict.round}, expected {block.round_no}")
                if block.stale:
                    if not verdict.discarded:  # the verifier committed what this device dropped
                        raise status_error(grpc.StatusCode.INTERNAL, f"round {block.round_no} was verified, not discarded")
                    continue  # sent on an assumption that failed: answered "discarded"
                if verdict.discarded:  # the verifier saw otherwise: resynchronise on what is committed
                    self._drop(inflight)
                    self.planner.record_ahead(False)
                    self.stats.discarded_blocks += 1
                    await self._send(stream, inflight, await self._fresh_block())
                    continue
                # Step 3: commit, and keep or drop what is in flight behind it.
                new_tokens = self._commit(block, verdict, inflight)
                yield new_tokens
                if verdict.draining and not verdict.finished:
                    raise ReplicaMoved()  # committed; the replica ends the stream: reopen elsewhere
                if verdict.finished or self.planner.should_switch(Path.SPECULATIVE, self.remaining):
                    await stream.close(CLOSE_REQUEST)
                    return
                if not any(not b.stale for b in inflight):
                    fresh = await self._fresh_block()
                    if fresh is None:
                        return  # no room left to draft: the cloud finishes alone
                    await self._send(stream, inflight, fresh)
        finally:
            stream.cancel()

    def _commit(self, block: Block, verdict, inflight: deque[Block]) -> list[int]:
        now = time.perf_counter()
        n, token = verdict.accepted, verdict.next_token
        before = len(self.committed)
        path = list(verdict.accepted_path) if block.parents is not None else list(range(n))
        new_tokens = [block.tokens[i] for i in path] + [token]
        chain = sum(1 for i in path if i < self._chain_length(block))  # drafts the draft's context holds
        self.committed.extend(new_tokens)
        self.generated.extend(new_tokens)
        k = self._chain_length(block)
        wait_ms = (now - max(block.sent_at, self._last_verdict_at)) * 1000
        wall_ms = (now - self._last_verdict_at) * 1000
        self._last_verdict_at = now
        self.stats.record_round(k, n, len(new_tokens), batch_size=verdict.batch_size)
        self.stats.draft_s += block.draft_ms / 1000
        self.stats.wait_s += wait_ms / 1000
        self.rounds.append(RoundRecord(k, tuple(block.tokens[:k]), min(n, k), token, block.draft_ms, wait_ms,
                                       verdict.batch_size, verdict.verify_ms, wall_ms))
        self.policy.update(k, n, draft_ms=None if block.prefilled else block.draft_ms, wait_ms=wait_ms)
        # A block sent ahead was waiting at the verifier already: its wait is no round trip.
        self.planner.record_round(wall_ms=wall_ms, wait_ms=wait_ms if not block.ahead else None,
                                  forward_ms=verdict.verify_ms, tokens=len(new_tokens), k=k)
        if block.ahead:
            self.planner.record_ahead(True)
            self.stats.ahead_hits += 1
        self.round_no = block.round_no + 1
        if verdict.finished:
            self.finish_reason = finish_name(verdict.finish_reason)
        holds = n == k and bool(inflight) and not inflight[0].stale and inflight[0].assumed == token and not verdict.finished
        if not holds:
            # The draft's context holds the chain: keep its accepted part, then what else came.
            self._drop(inflight, keep=before + chain)
            self.draft.append(new_tokens[chain:])
        return new_tokens

    @staticmethod
    def _chain_length(block: Block) -> int:
        """The drafts of the block's main chain (a tree's leaves come after it)."""
        if block.parents is None:
            return len(block.tokens)
        return next((i for i, parent in enumerate(block.parents) if parent != i - 1), len(block.parents))

    def _drop(self, inflight: deque[Block], *, keep: int | None = None) -> None:
        """Every block in flight is stale; the draft rolls back to ``keep`` tokens (default: the
        committed ones)."""
        for block in inflight:
            if not block.stale:
                block.stale = True
                self.planner.record_ahead(False)
                self.stats.discarded_blocks += 1
        self.draft.rollback_to(len(self.committed) if keep is None else keep)

    async def _send(self, stream: SessionStream, inflight: deque[Block], block: Block | None) -> None:
        if block is None:
            return
        q = block.q if self.params.mode is Mode.EXACT else None
        block.sent_at = time.perf_counter()
        await stream.send(draft_request(block.round_no, block.tokens, q, assumed_token=block.assumed, parents=block.parents))
        inflight.append(block)

    def _depth(self) -> int:
        setting = self.params.send_ahead
        return self.planner.depth() if setting == "auto" else int(setting)

    async def _fill(self, stream: SessionStream, inflight: deque[Block]) -> None:
        while True:
            valid = [b for b in inflight if not b.stale]
            if not valid or len(valid) >= self._depth() or valid[-1].parents is not None:
                return  # (nothing goes ahead of a tree: which of its paths holds is unknown)
            projected = len(self.committed) + sum(len(b.tokens) + 1 for b in valid)
            budget = self.remaining - sum(len(b.tokens) + 1 for b in valid)
            room = self.max_context - projected - 1
            if room < 1 or budget < 2:
                return
            k = self.policy.next_k(min(self.info.max_k, room, budget - 1))
            await self._send(stream, inflight, await self._ahead_block(valid[-1], k))

    # ---- drafting ------------------------------------------------------------------------

    def _rngs(self, round_no: int) -> tuple[np.random.Generator | None, np.random.Generator | None]:
        """(the generator of the bonus guess before ``round_no``, the generator of its drafts)."""
        if self.sampling is None:
            return None, None
        if self.params.mode is Mode.COUPLED:  # keyed by position, not round: one for guess and drafts
            return PositionDraws(self.params.seed), PositionDraws(self.params.seed)
        return np.random.default_rng([self.params.seed, round_no, GUESS_SALT]), round_rng(self.params.seed, round_no)

    async def _fresh_block(self, *, prefilled: bool = False) -> Block | None:
        room = self._draft_room()
        if room < 1:
            return None
        k = self.policy.next_k(min(self.info.max_k, room, max(1, self.remaining - 1)))
        _, rng = self._rngs(self.round_no)
        tree = min(self.params.tree, self.info.max_tree_tokens - k) if self.sampling is None else 0
        proposal = await self._on_draft_thread(self.draft.propose, k, self.draft_sampling, rng, self.top_n, self.lookup,
                                               tree > 0, self.params.lookup_weight)
        block = Block(self.round_no, proposal.tokens, proposal.q, None, proposal.draft_ms, prefilled)
        if tree > 0:
            add_leaves(block, proposal.alternatives, tree)
        return block

    async def _ahead_block(self, previous: Block, k: int) -> Block:
        """The guessed bonus token of ``previous``, then k drafts after it, for the next round."""
        round_no = previous.round_no + 1
        guess_rng, rng = self._rngs(round_no)

        def work():
            weight = self.params.lookup_weight
            guess = self.draft.propose(1, self.draft_sampling, guess_rng, self.top_n, self.lookup, False, weight)
            return guess, self.draft.propose(k, self.draft_sampling, rng, self.top_n, self.lookup, False, weight)

        guess, proposal = await asyncio.get_running_loop().run_in_executor(self.draft_thread, work)
        return Block(round_no, proposal.tokens, proposal.q, guess.tokens[0], guess.draft_ms + proposal.draft_ms, False)

    async def _on_draft_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.draft_thread, lambda: fn(*args))

    # ---- cloud-only over one Generate stream ----------------------------------------------

    async def _cloud_segment(self) -> AsyncIterator[list[int]]:
        request = generate_request(
            self.committed, self.params.sampling, self.draft.manifest.tokenizer_fingerprint,
            max_new_tokens=self.remaining, stop_token_ids=self.stop_token_ids, first_round=self.round_no,
        )
        auto = self.planner.mode == "auto"
        probe = asyncio.create_task(self._probe_rtt()) if auto and self.rtt_probe else None
        shadow = Shadow(self) if auto and self.sampling is None else None
        try:
            first_at, since_first = None, 0
            async for tokens, finish in generate_tokens(self.stub, request, self.timeout, self.stats):
                if first_at is None:
                    first_at = time.perf_counter()
                else:
                    since_first += len(tokens)
                    self.planner.record_cloud_rate((time.perf_counter() - first_at) * 1000, since_first)
                self.committed.extend(tokens)
                self.generated.extend(tokens)
                self.stats.generated += len(tokens)
                self.stats.target_calls += len(tokens)
                self.stats.cloud_only_tokens += len(tokens)
                self.round_no += len(tokens)
                if finish:
                    self.finish_reason = finish
                yield tokens
                if finish:
                    return
                if shadow is not None:
                    shadow.observe(tokens)
                if self._draft_room() > 1 and self.planner.should_switch(Path.CLOUD_ONLY, self.remaining):
                    return  # the Generate call is cancelled: tokens not received are not committed
            raise StreamEnded(grpc.StatusCode.UNAVAILABLE, "the Generate stream ended before its last token")
        finally:
            if probe is not None:
                probe.cancel()
            if shadow is not None:
                await shadow.settle()

    async def _probe_rtt(self) -> None:
        while True:
            await asyncio.sleep(RTT_PROBE_INTERVAL_S)
            try:
                self.planner.record_rtt(await self.rtt_probe())
            except Exception:  # a failed probe says nothing about the stream; the stream reports its own errors
                pass


class Shadow:
    """The draft run over a cloud-only stream, off the event loop: what it would have proposed
    at each streamed token tells the planner the tokens per round speculation would commit
    here (``Planner.record_shadow``), and keeps the draft's cache in step with the stream. While
    the planner judges the draft unpromising it rests (``Planner.shadow_wanted``) and a look
    starts it from the last ``SHADOW_CONTEXT`` tokens; the next speculative segment resets it."""

    def __init__(self, run: SpeculativeRun):
        self.run = run
        self.pending: asyncio.Future | None = None
        self.resting = False  # the planner has had the draft skip streamed tokens
        draft, committed = run.draft, run.committed
        self.synced = draft.tokens[: len(committed)] == committed
        if self.synced:
            draft.rollback_to(len(committed))

    def observe(self, tokens: list[int]) -> None:
        run = self.run
        if len(run.committed) + 1 >= run.max_context:
            self.synced = False  # the draft falls behind; the next speculative segment resets it
            return
        if not run.planner.shadow_wanted(len(tokens)):
            self.synced, self.resting = False, True
            return
        context = None
        if not self.synced:
            if not self.resting:
                return  # fell behind: the next speculative segment resets it
            context = run.committed[-len(tokens) - SHADOW_CONTEXT : -len(tokens)]  # a look after a rest
            self.synced, self.resting = True, False
        k = run.policy.next_k(run.info.max_k)
        loop = asyncio.get_running_loop()
        # One draft thread: observations run in the order the tokens came.
        future = loop.run_in_executor(run.draft_thread, self._look, context, list(tokens))

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                self.synced = False
                return
            run.planner.record_shadow([p == t for p, t in zip(f.result(), tokens)], k)

        future.add_done_callback(done)
        self.pending = future

    def _look(self, context: list[int] | None, tokens: list[int]) -> list[int]:
        if context is not None:
            self.run.draft.reset(context)
        return self.run.draft.observe(tokens, self.run.lookup)

    async def settle(self) -> None:
        """Waits for the draft thread (the next segment uses the draft) and leaves the draft at
        the committed tokens, or resets it when it fell behind."""
        if self.pending is not None:
            await asyncio.gather(self.pending, return_exceptions=True)
        if not self.synced:
            return
        draft, committed = self.run.draft, self.run.committed
        if draft.tokens != committed[: len(draft.tokens)]:
            self.synced = False


def add_leaves(block: Block, alternatives: list[tuple[int, float]], count: int) -> None:
    """Turns a chain into a tree: the runner-up of each of the ``count`` least sure drafts joins
    as a leaf, a sibling of that draft (parent: the draft before it, -1 for the first)."""
    chain = len(block.tokens)
    least_sure = sorted(range(chain), key=lambda i: alternatives[i][1])[:count]
    block.parents = [i - 1 for i in range(chain)]
    for i in sorted(least_sure):
        block.tokens.append(alternatives[i][0])
        block.parents.append(i - 1)


def path_mode(params: GenerationParams) -> str:
    """The planner's mode for a request: auto only with adaptive k and ``speculate="auto"``."""
    if params.speculate is False:
        return "cloud_only"
    return "auto" if params.k == "auto" and params.speculate == "auto" else "speculative"
