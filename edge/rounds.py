"""The device's speculative loop over one gRPC session, with resume on a broken stream.

One round, top to bottom:

1. pick k (fixed or adaptive) and draft k tokens with the ONNX draft (some may be ready from
   drafting ahead);
2. send them as a Draft; while the verdict is in flight, optionally draft ahead: the
   continuation that assumes every draft is accepted and the target's bonus token equals the
   draft's own next token;
3. on the verdict (n accepted, next token t) commit drafts[:n] + [t]. If the guess held, the
   tokens drafted ahead become the start of the next block; otherwise they are dropped and the
   draft's cache is rolled back to the committed tokens.

If the stream breaks (replica restart, dropped connection, timeout), a new session is opened
with every committed token as its prompt and the round numbering continued, so seeded draws
repeat and the output equals an uninterrupted run: no token is lost or repeated. When the
draft's own context limit is reached first, the rest is generated cloud-only (Generate).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Executor
from typing import AsyncIterator

import grpc
import numpy as np

from edgespec.edge.cloud_only import CloudOnlyRun
from edgespec.edge.draft import Proposal
from edgespec.edge.lookup import LookupConfig
from edgespec.edge.params import GenerationParams, Mode
from edgespec.edge.policy import make_policy
from edgespec.edge.sampling import round_rng
from edgespec.edge.stats import RequestStats
from edgespec.edge.transport import Retries, SessionStream
from edgespec.edge.types import RoundRecord, ServerInfo
from edgespec.edge.wire import CLOSE_REQUEST, draft_request, finish_name, open_request
from edgespec.v1 import speculative_pb2_grpc as pb_grpc

GUESS_SALT = 0xB0  # separates the bonus-guess draws from the round's own draws


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
    ):
        self.stub, self.draft, self.draft_thread = stub, draft, draft_thread
        self.params, self.info = params, info
        self.timeout, self.max_retries = timeout, max_retries
        self.prompt_ids = list(prompt_ids)
        self.committed = list(prompt_ids)
        self.generated: list[int] = []
        self.finish_reason = ""
        self.stats = RequestStats()
        self.rounds: list[RoundRecord] = []
        self.round_no = 0
        self.policy = make_policy(params.k, k_max=info.max_k)
        self.sampling = None if params.mode is Mode.GREEDY else params.sampling
        self.top_n = params.top_n if params.mode is Mode.EXACT else 0
        self.lookup = LookupConfig() if params.lookup and self.sampling is None else None
        stop = params.stop_token_ids
        self.stop_token_ids = list(draft.manifest.eos_token_ids if stop is None else stop)
        # The draft can see at most this many positions; past it the cloud finishes alone.
        self.max_context = min(info.max_context, draft.manifest.max_positions)
        self._ready: list[Proposal] = []  # drafted ahead, valid for the next block
        self._ready_rng: np.random.Generator | None = None

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.generated)

    async def chunks(self) -> AsyncIterator[list[int]]:
        started = time.perf_counter()
        retries = Retries(self.max_retries, self.timeout)
        try:
            while not self.finish_reason:
                if self.max_context - len(self.committed) < 2:  # no room left to draft a token
                    async for tokens in self._cloud_only_rest():
                        yield tokens
                    break
                stream = SessionStream(self.stub.Session(), self.timeout, self.stats)
                try:
                    async for new_tokens in self._session(stream):
                        if not self.stats.first_token_s:
                            self.stats.first_token_s = time.perf_counter() - started
                        retries.progress()
                        yield new_tokens
                except (grpc.RpcError, asyncio.TimeoutError) as exc:
                    delay = retries.next_delay(exc)  # raises the typed error when giving up
                    self.stats.resumes += 1
                    self._drop_ready()
                    await asyncio.sleep(delay)
                finally:
                    stream.cancel()
        finally:
            self.stats.wall_s = time.perf_counter() - started

    async def _session(self, stream: SessionStream) -> AsyncIterator[list[int]]:
        await stream.send(
            open_request(
                self.committed,
                self.params.sampling,
                self.params.mode,
                self.draft.manifest.tokenizer_fingerprint,
                max_new_tokens=self.remaining,
                stop_token_ids=self.stop_token_ids,
                first_round=self.round_no,
            )
        )
        opened = (await stream.receive()).opened
        max_context = min(self.max_context, opened.max_context)
        self._drop_ready()
        if self.draft.tokens[: len(self.committed)] == self.committed:
            self.draft.rollback_to(len(self.committed))  # keeps whatever cache is still valid
        else:
            self.draft.reset(self.committed)
        prefilled = False
        while True:
            # A round commits up to k + 1 tokens, all of which the draft must still be able to see.
            room = max_context - len(self.committed) - 1
            if room < 1:
                return  # the context is full: chunks() lets the cloud finish alone
            # Step 1: draft k tokens on the device.
            k = self.policy.next_k(min(opened.max_k, room, max(1, self.remaining - 1)))
            t0 = time.perf_counter()
            proposal = await self._draft_block(k)
            t1 = time.perf_counter()
            # Step 2: send the block; draft ahead while it is in flight.
            q = proposal.q if self.params.mode is Mode.EXACT else None
            await stream.send(draft_request(self.round_no, proposal.tokens, q))
            ahead_room = min(k, room - k - 1, self.remaining - k - 2)  # the next block's room
            ahead = self._start_ahead(ahead_room) if self.params.draft_ahead and ahead_room > 0 else None
            try:
                verdict = (await stream.receive()).verdict
            finally:
                ahead_proposals = await self._finish_ahead(ahead)
            t2 = time.perf_counter()
            # Step 3: commit, and keep or drop what was drafted ahead.
            n, token = verdict.accepted, verdict.next_token
            new_tokens = list(proposal.tokens[:n]) + [token]
            guessed = n == k and len(ahead_proposals) > 1 and ahead_proposals[0].tokens[0] == token
            if guessed:
                self._ready = ahead_proposals[1:]
                self.stats.ahead_hits += 1
            else:
                self._ready_rng = None
                self.draft.rollback_to(len(self.committed) + n)
                self.draft.append([token])
            self.committed.extend(new_tokens)
            self.generated.extend(new_tokens)
            self.stats.record_round(k, n, len(new_tokens), batch_size=verdict.batch_size)
            self.rounds.append(
                RoundRecord(k, tuple(proposal.tokens), n, token, (t1 - t0) * 1000, (t2 - t1) * 1000, verdict.batch_size)
            )
            self.stats.draft_s += t1 - t0
            self.stats.wait_s += t2 - t1
            self.policy.update(k, n, draft_ms=(t1 - t0) * 1000 if prefilled else None, wait_ms=(t2 - t1) * 1000)
            prefilled = True
            self.round_no += 1
            if verdict.finished:
                self.finish_reason = finish_name(verdict.finish_reason)
            yield new_tokens
            if verdict.finished:
                await stream.send(CLOSE_REQUEST)
                await stream.done_writing()
                return

    # ---- drafting ------------------------------------------------------------------------

    def _drop_ready(self) -> None:
        if self._ready:
            self.draft.rollback_to(len(self.committed))
        self._ready, self._ready_rng = [], None

    async def _draft_block(self, k: int) -> Proposal:
        """k drafts for this round: first any drafted ahead, then freshly drafted ones."""
        ready, rng = self._ready[:k], self._ready_rng
        if len(self._ready) > k:
            self.draft.rollback_to(len(self.committed) + k)
        self._ready, self._ready_rng = [], None
        if rng is None and self.sampling:
            rng = round_rng(self.params.seed, self.round_no)
        tokens = [t for p in ready for t in p.tokens]
        q = [d for p in ready for d in (p.q or [])]
        draft_ms = 0.0
        if len(tokens) < k:
            fresh = await self._on_draft_thread(self.draft.propose, k - len(tokens), self.sampling, rng, self.top_n, self.lookup)
            tokens += fresh.tokens
            q += fresh.q or []
            draft_ms = fresh.draft_ms
        return Proposal(tokens=tokens, q=q if self.sampling else None, draft_ms=draft_ms)

    def _start_ahead(self, limit: int):
        """Drafts the guessed bonus token, then up to ``limit`` tokens of the next block."""
        stop = threading.Event()
        guess_rng = np.random.default_rng([self.params.seed, self.round_no, GUESS_SALT]) if self.sampling else None
        next_rng = round_rng(self.params.seed, self.round_no + 1) if self.sampling else None

        def work() -> list[Proposal]:
            out = [self.draft.propose(1, self.sampling, guess_rng, self.top_n, self.lookup)]
            while len(out) <= limit and not stop.is_set():
                out.append(self.draft.propose(1, self.sampling, next_rng, self.top_n, self.lookup))
            return out

        self._ready_rng = next_rng
        return stop, asyncio.get_running_loop().run_in_executor(self.draft_thread, work)

    async def _finish_ahead(self, ahead) -> list[Proposal]:
        if ahead is None:
            return []
        stop, future = ahead
        stop.set()  # the verdict is here: at most the token being drafted still completes
        return await future

    async def _on_draft_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.draft_thread, lambda: fn(*args))

    # ---- the cloud-only rest -------------------------------------------------------------

    async def _cloud_only_rest(self) -> AsyncIterator[list[int]]:
        """Past the draft's context limit the target finishes alone (Generate RPC)."""
        rest = CloudOnlyRun(
            self.stub, self.committed, self.params.sampling, self.draft.manifest.tokenizer_fingerprint,
            max_new_tokens=self.remaining, stop_token_ids=self.stop_token_ids, stats=self.stats,
            timeout=self.timeout, max_retries=self.max_retries,
        )
        async for tokens in rest.chunks():
            self.committed.extend(tokens)
            self.generated.extend(tokens)
            self.stats.cloud_only_tokens += len(tokens)
            yield tokens
        self.finish_reason = rest.finish_reason
