"""The device's generation loop: it moves the protocol's messages (``protocol.ClientSession``)
over gRPC, drafts blocks (``drafting.BlockDrafter``), tells the planner (``planner.Planner``) what it
measured (``observe``) and asks it which path, k and depth (``decide``) at named points. Read top to bottom:

``chunks`` runs *segments* until the generation finishes. A speculative segment is one Session
stream:

1. Open (with every committed token) and, right behind it, the first block: drafting the
   first block overlaps the Open's round trip;
2. keep up to ``depth()`` blocks in flight: each block after the first is drafted *ahead*, on
   the assumption that the block before it is accepted whole and its bonus token is the draft's
   own guess; the verifier verifies such a block only if the assumption held, and otherwise
   answers ``discarded`` without running the model;
3. apply each verdict: a commit yields its tokens; the blocks in flight behind it stay valid
   only if it is exactly what they assumed, otherwise they are stale (their verdicts come back
   ``discarded`` and are skipped), the draft rolls back to the committed tokens and a fresh
   block goes out for the next round;
4. stop when the verdict says finished, or the planner switches path; move when it says draining.

A cloud-only segment is one Generate stream (``speculate=False`` and ``generate_cloud`` take
only this path). The planner ends a segment when the other path is predicted clearly faster;
the next one starts from every committed token, round numbering continued, so no token is lost
or repeated and seeded draws carry on. A broken stream is resumed the same way (``Retries``
decides how often). When the draft's own context limit is reached the cloud finishes alone.

Every time reading goes through ``clock`` (seconds; ``time.perf_counter`` by default), so a
test can drive the planner with scripted time.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import asdict
from typing import AsyncIterator, Awaitable, Callable

import grpc

from edgespec.edge.drafter import Drafter
from edgespec.edge.drafting import BlockDrafter
from edgespec.edge.lookup_draft import LookupDraft
from edgespec.edge.params import GenerationParams, Mode, path_mode, served_mode
from edgespec.edge.planner import Decision, FirstToken, Info, Planner, Round, Segment, Start, Streamed
from edgespec.edge.planner import Path as Route  # the planner's Path, named apart from pathlib.Path
from edgespec.edge.protocol import Block, ClientSession, Kind, Outcome
from edgespec.edge.sampling import PositionDraws
from edgespec.edge.shadow import Shadow
from edgespec.edge.stats import RequestStats
from edgespec.edge.transport import ReplicaMoved, Retries, SessionStream, StreamEnded, Stub, generate_tokens
from edgespec.edge.types import ReplicaProbe, RoundRecord, ServerInfo
from edgespec.v1 import speculative_pb2 as pb

RTT_PROBE_INTERVAL_S = 0.5  # while streaming cloud-only: how often the round trip is probed
Clock = Callable[[], float]
Probe = Callable[[], Awaitable[ReplicaProbe]]  # one Info round trip (``AsyncClient.probe``)


class Generation:
    """One generation request; iterate ``chunks()`` for the tokens as they are committed."""

    decision: Decision  # the planner's last word: the path, the next block's k, the blocks in flight

    def __init__(self, stub: Stub, drafter: Drafter, draft_thread: Executor,
                 prompt_ids: list[int], params: GenerationParams, info: ServerInfo, *, timeout: float,
                 max_retries: int, planner: Planner | None = None,
                 rtt_probe: Probe | None = None, clock: Clock = time.perf_counter):
        params = served_mode(params, info.modes)  # an older server: exact instead of coupled
        if params.lookup == "only":
            drafter = LookupDraft(drafter)  # no draft model: every draft comes from the context
        stop = drafter.eos_token_ids if params.stop_token_ids is None else params.stop_token_ids
        # The draft can see at most this many positions; past it the cloud finishes alone.
        room = info.max_context if params.lookup == "only" else min(info.max_context, drafter.manifest.max_positions)
        self.session = ClientSession(prompt_ids, params, drafter.manifest.tokenizer_fingerprint, stop,
                                     max_context=room, max_k=info.max_k)
        self.planner = planner or Planner(path_mode(params))
        self.send_ahead = params.send_ahead if info.send_ahead else 1
        self.tree = params.tree if params.mode is Mode.GREEDY else 0
        self.drafter, self.drafting = drafter, BlockDrafter(drafter, draft_thread, params, clock)
        self.draft_thread, self.stub, self.rtt_probe, self.clock = draft_thread, stub, rtt_probe, clock
        self.params, self.info, self.timeout = params, info, timeout
        self.retries = Retries(max_retries, timeout, clock=clock)
        self.stats = RequestStats(seed=None if params.is_greedy else params.seed)
        self.rounds: list[RoundRecord] = []
        self.segments: list[tuple[str, int]] = []  # (path, tokens) in the order they were produced
        self._last_verdict_at = 0.0
        self._moved_at: float | None = None

    @property
    def generated(self) -> list[int]:
        return self.session.generated

    @property
    def finish_reason(self) -> str:
        return self.session.finish_reason

    # ---- the loop over segments ----------------------------------------------------------

    async def chunks(self) -> AsyncIterator[list[int]]:
        started, planner, session = self.clock(), self.planner, self.session
        planner.observe(Start(self.params.max_new_tokens, self.info.max_k, self.params.k, self.send_ahead))
        self.decision = planner.decide(None, self.params.max_new_tokens)
        path = self.decision.path
        try:
            while not session.finish_reason:
                if path is Route.SPECULATIVE and session.draft_room < 1:
                    path = Route.CLOUD_ONLY  # the draft's context is full: the cloud finishes alone
                segment = self._speculative_segment() if path is Route.SPECULATIVE else self._cloud_segment()
                planner.observe(Segment(path))
                try:
                    async for tokens in segment:
                        self._progress(started, path, tokens)
                        yield tokens
                except (grpc.RpcError, asyncio.TimeoutError) as exc:
                    await self._recover(exc)  # raises the typed error when giving up
                    continue  # the same path again, from every committed token
                if not session.finish_reason and (path is Route.CLOUD_ONLY or session.draft_room >= 1):
                    path = Route.CLOUD_ONLY if path is Route.SPECULATIVE else Route.SPECULATIVE
                    self.stats.switches += 1
        finally:
            self.stats.wall_s = self.clock() - started
            self.stats.switch_log = [asdict(switch) for switch in planner.switch_log]

    def _progress(self, started: float, path: Route, tokens: list[int]) -> None:
        if not tokens:
            return
        now = self.clock()
        if not self.stats.first_token_s:
            self.stats.first_token_s = now - started
        self.retries.progress()
        if self._moved_at is not None:
            self.stats.move_outages_s.append(now - self._moved_at)
            self._moved_at = None
        if self.segments and self.segments[-1][0] == path.value:
            self.segments[-1] = (path.value, self.segments[-1][1] + len(tokens))
        else:
            self.segments.append((path.value, len(tokens)))

    async def _recover(self, error: BaseException) -> None:
        """Counts the break, reroutes where another replica should take the session, and waits."""
        retry = self.retries.decide(error)
        reroute = getattr(self.stub, "reconnect", None)  # the client's KeyedStub: a fresh connection
        if retry.reroute and reroute is not None:
            reroute()
        if retry.cause == "moved":
            self.stats.moves += 1
            self._moved_at = self.clock()
        elif retry.cause == "failure":
            self.stats.resumes += 1
        await asyncio.sleep(retry.delay_s)

    # ---- speculation over one Session stream ---------------------------------------------

    async def _speculative_segment(self) -> AsyncIterator[list[int]]:
        session, planner = self.session, self.planner
        stream = SessionStream(self.stub.Session(), self.timeout, self.stats)
        probe = self._probe_task(streaming=False)
        try:
            # Step 1: Open, and the first block right behind it.
            await stream.send(session.open())
            self.drafting.sync(session.committed)
            self._last_verdict_at = self.clock()
            await self._send_fresh(stream, prefilled=True)
            opened = (await stream.receive()).opened
            session.opened(opened)
            self.stats.replica_ids.append(opened.replica_id)
            while session.inflight:
                # Step 2: keep the pipeline full with blocks drafted ahead.
                await self._fill(stream)
                # Step 3: apply the next verdict.
                verdict = (await stream.receive()).verdict
                outcome = session.verdict(verdict)
                if outcome.kind is Kind.STALE:
                    continue  # sent on an assumption that failed: answered "discarded"
                if outcome.kind is Kind.DISCARDED:
                    self._dropped(outcome)
                    await self._send_fresh(stream)
                    continue
                self._account(outcome, verdict)
                yield outcome.tokens
                # Step 4: move, stop, or go on.
                if outcome.draining:
                    raise ReplicaMoved()  # committed; the replica ends the stream: reopen elsewhere
                if outcome.finished:
                    await stream.close(session.close())
                    return
                self.decision = planner.decide(Route.SPECULATIVE, session.remaining)
                if self.decision.path is not Route.SPECULATIVE:
                    await stream.close(session.close())
                    return
                if not session.valid_inflight and not await self._send_fresh(stream):
                    return  # no room left to draft: the cloud finishes alone
        finally:
            if probe is not None:
                probe.cancel()
            stream.cancel()

    async def _send(self, stream: SessionStream, block: Block) -> None:
        block.sent_at = self.clock()
        await stream.send(self.session.draft(block))

    async def _send_fresh(self, stream: SessionStream, *, prefilled: bool = False) -> bool:
        """Drafts and sends a block for the next round; False when there is no room to draft."""
        limit = self.session.fresh_limit()
        if limit < 1:
            return False
        k = max(1, min(self.decision.k, limit))
        leaves = max(0, min(self.tree, self.info.max_tree_tokens - k))  # runner-up leaves riding along (greedy)
        block = await self.drafting.fresh(self.session.round_no, k, leaves=leaves, prefilled=prefilled)
        await self._send(stream, block)
        return True

    async def _fill(self, stream: SessionStream) -> None:
        while len(self.session.valid_inflight) < self.decision.depth:
            limit = self.session.ahead_limit()
            if limit < 1:
                return
            block = await self.drafting.ahead(self.session.next_ahead_round(), max(1, min(self.decision.k, limit)))
            await self._send(stream, block)

    def _dropped(self, outcome: Outcome) -> None:
        """Blocks sent ahead went stale: the draft forgets them."""
        if outcome.dropped:
            self.stats.discarded_blocks += outcome.dropped
        if outcome.kind is Kind.DISCARDED or not outcome.holds:
            # The draft's context holds the chain: keep its accepted part, then what else came.
            self.drafter.rollback_to(outcome.keep)
            self.drafter.append(self.session.committed[outcome.keep:])

    def _account(self, outcome: Outcome, verdict: pb.Verdict) -> None:
        """A committed round (``verdict`` its message): stats, the round's record, what the
        planner learns, the draft."""
        now, block = self.clock(), outcome.block
        k, n = block.chain_length, outcome.accepted
        wait_ms = (now - max(block.sent_at, self._last_verdict_at)) * 1000
        wall_ms = (now - self._last_verdict_at) * 1000
        self._last_verdict_at = now
        self.stats.record_round(k, n, len(outcome.tokens), batch_size=verdict.batch_size)
        self.stats.draft_s += block.draft_ms / 1000
        self.stats.wait_s += wait_ms / 1000
        self.stats.ahead_hits += block.ahead
        self.rounds.append(RoundRecord(k, tuple(block.tokens[:k]), min(n, k), verdict.next_token, block.draft_ms,
                                       wait_ms, verdict.batch_size, verdict.verify_ms, wall_ms))
        # A block sent ahead waited behind its predecessor: its wait is no round trip.
        self.planner.observe(Round(k, n, len(outcome.tokens), wall_ms, None if block.ahead else wait_ms,
                                   verdict.verify_ms, None if block.prefilled else block.draft_ms))
        self._dropped(outcome)

    # ---- cloud-only over one Generate stream ----------------------------------------------

    async def _cloud_segment(self) -> AsyncIterator[list[int]]:
        session, planner, stats = self.session, self.planner, self.stats
        probe = self._probe_task(streaming=True)
        shadow = self._shadow() if planner.mode == "auto" else None
        try:
            first_at, since_first, called = None, 0, self.clock()
            async for tokens, finish, probs in generate_tokens(self.stub, session.generate(), self.timeout, stats):
                now = self.clock()
                if first_at is None:
                    first_at = now
                    planner.observe(FirstToken((first_at - called) * 1000))
                else:
                    since_first += len(tokens)
                    planner.observe(Streamed((now - first_at) * 1000, since_first))
                session.tokens(tokens, finish)
                stats.generated += len(tokens)
                stats.target_calls += len(tokens)
                stats.cloud_only_tokens += len(tokens)
                yield tokens
                if finish:
                    return
                if shadow is not None:
                    shadow.observe(tokens, session.committed, session.max_context, probs)
                if session.draft_room > 1:
                    self.decision = planner.decide(Route.CLOUD_ONLY, session.remaining)
                    if self.decision.path is not Route.CLOUD_ONLY:
                        return  # the Generate call is cancelled: tokens not received are not committed
            raise StreamEnded(grpc.StatusCode.UNAVAILABLE, "the Generate stream ended before its last token")
        finally:
            if probe is not None:
                probe.cancel()
            if shadow is not None:
                await shadow.finish(session.committed)

    def _shadow(self) -> Shadow:
        settings = self.drafting.settings
        draws = PositionDraws(self.drafting.seed) if self.drafting.coupled and settings.sampling is not None else None
        return Shadow(self.drafter, self.draft_thread, self.planner, self.session.committed, lookup=settings.lookup,
                      sampling=settings.sampling, lookup_weight=settings.lookup_weight, draws=draws,
                      top_n=settings.top_n, clock=self.clock)

    def _probe_task(self, *, streaming: bool) -> asyncio.Task | None:
        """``_probe`` beside a segment, where the planner chooses the path (k=auto) and a probe
        was given; the segment cancels it when it ends."""
        if self.planner.mode != "auto" or self.rtt_probe is None:
            return None
        return asyncio.create_task(self._probe(self.rtt_probe, streaming=streaming))

    async def _probe(self, probe: Probe, *, streaming: bool) -> None:
        """Info round trips beside a segment, for what no segment of the other path measures.

        Beside a stream, from its start and every ``RTT_PROBE_INTERVAL_S``: the round trip (a
        stream may be left only once it has one, and a first probe after the interval kept a
        stream from coming back for its first ~40 tokens on 5G, where the draft was predicted
        faster from its fifth), the replica's verify forward, and its stream figures. Beside a
        speculative segment, once: the replica's stream figures, which move the price of the
        stream this device measured earlier by as much as the replica's load has moved since
        (rounds measure the round trip and the forward themselves)."""
        while True:
            try:
                reply = await probe()
                forward, rtt = (reply.forward_ms, reply.rtt_ms) if streaming else (0.0, None)
                self.planner.observe(Info(forward, reply.decode_ms, reply.stream_ms, rtt))
            except Exception:  # a failed probe says nothing about the segment; the segment reports its own errors
                pass
            if not streaming:
                return
            await asyncio.sleep(RTT_PROBE_INTERVAL_S)
