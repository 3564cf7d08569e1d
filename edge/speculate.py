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
import random
import threading
import time
from concurrent.futures import Executor
from typing import AsyncIterator

import grpc
import numpy as np

from edgespec.edge.draft import Proposal
from edgespec.edge.errors import RequestTimeoutError, from_rpc_error, is_retryable
from edgespec.edge.lookup import LookupConfig
from edgespec.edge.policy import make_policy
from edgespec.edge.sampling import SamplingParams, round_rng
from edgespec.edge.stats import RequestStats
from edgespec.edge.types import GenerationParams, RoundRecord, ServerInfo
from edgespec.v1 import speculative_pb2 as pb
from edgespec.v1 import speculative_pb2_grpc as pb_grpc

WIRE_MODES = {"greedy": pb.VERIFY_MODE_GREEDY, "exact": pb.VERIFY_MODE_EXACT, "token": pb.VERIFY_MODE_TOKEN}
FINISH_NAMES = {
    pb.FINISH_REASON_STOP_TOKEN: "stop_token",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CONTEXT: "context",
}
GRPC_FRAME_HEADER = 5  # bytes before every gRPC message on the wire
GUESS_SALT = 0xB0  # separates the bonus-guess draws from the round's own draws


def backoff_s(attempt: int, base: float = 0.2, cap: float = 5.0) -> float:
    """Exponential backoff with jitter for the attempt-th consecutive failure (1-based)."""
    return min(cap, base * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


def sampling_proto(params: GenerationParams) -> pb.SamplingParams:
    return pb.SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=params.seed)


def generate_request(prompt_ids: list[int], params: GenerationParams, manifest, stop_token_ids, max_new_tokens: int):
    return pb.GenerateRequest(
        prompt_ids=prompt_ids,
        sampling=sampling_proto(params),
        tokenizer_fingerprint=manifest.tokenizer_fingerprint,
        max_new_tokens=max_new_tokens,
        stop_token_ids=list(stop_token_ids),
    )


async def cloud_tokens(stub, request: pb.GenerateRequest, timeout: float, stats: RequestStats):
    """Streams a Generate call: yields (new tokens, finish reason or "") per message."""
    stats.bytes_sent += request.ByteSize() + GRPC_FRAME_HEADER
    try:
        call = stub.Generate(request)
        while True:
            reply = await asyncio.wait_for(call.read(), timeout)
            if reply is grpc.aio.EOF:
                return
            stats.bytes_received += reply.ByteSize() + GRPC_FRAME_HEADER
            tokens = list(reply.token_ids)
            stats.generated += len(tokens)
            stats.target_calls += len(tokens)
            yield tokens, FINISH_NAMES.get(reply.finish_reason, "unknown") if reply.finished else ""
    except asyncio.TimeoutError:
        raise RequestTimeoutError(f"no token within {timeout:g}s") from None
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


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
        self.sampling = None
        if params.mode != "greedy":
            self.sampling = SamplingParams(
                temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=params.seed
            )
        self.top_n = params.top_n if params.mode == "exact" else 0
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
        failures = 0
        try:
            while not self.finish_reason:
                if self.max_context - len(self.committed) < 2:  # no room left to draft a token
                    async for tokens in self._cloud_only_rest():
                        yield tokens
                    break
                call = self.stub.Session()
                try:
                    async for new_tokens in self._session(call):
                        if not self.stats.first_token_s:
                            self.stats.first_token_s = time.perf_counter() - started
                        failures = 0  # progress resets the retry budget
                        yield new_tokens
                except (grpc.RpcError, asyncio.TimeoutError) as exc:
                    failures += 1
                    if not is_retryable(exc) or failures > self.max_retries:
                        if isinstance(exc, asyncio.TimeoutError):
                            raise RequestTimeoutError(f"no reply within {self.timeout:g}s ({failures} attempt(s))") from None
                        raise from_rpc_error(exc) from None
                    self.stats.resumes += 1
                    self._drop_ready()
                    await asyncio.sleep(backoff_s(failures))
                finally:
                    call.cancel()
        finally:
            self.stats.wall_s = time.perf_counter() - started

    async def _session(self, call) -> AsyncIterator[list[int]]:
        await self._send(
            call,
            pb.SessionRequest(
                open=pb.Open(
                    prompt_ids=self.committed,
                    sampling=sampling_proto(self.params),
                    mode=WIRE_MODES[self.params.mode],
                    tokenizer_fingerprint=self.draft.manifest.tokenizer_fingerprint,
                    max_new_tokens=self.remaining,
                    stop_token_ids=self.stop_token_ids,
                    first_round=self.round_no,
                )
            ),
        )
        opened = (await self._receive(call)).opened
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
            draft_msg = pb.Draft(round=self.round_no, token_ids=proposal.tokens)
            if self.params.mode == "exact":
                draft_msg.q.extend(
                    pb.SparseDistribution(token_ids=d.token_ids.tolist(), probs=d.probs.tolist()) for d in proposal.q
                )
            await self._send(call, pb.SessionRequest(draft=draft_msg))
            ahead_room = min(k, room - k - 1, self.remaining - k - 2)  # the next block's room
            ahead = self._start_ahead(ahead_room) if self.params.draft_ahead and ahead_room > 0 else None
            try:
                verdict = (await self._receive(call)).verdict
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
                self.finish_reason = FINISH_NAMES.get(verdict.finish_reason, "unknown")
            yield new_tokens
            if verdict.finished:
                await self._send(call, pb.SessionRequest(close=pb.Close()))
                await call.done_writing()
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
        request = generate_request(self.committed, self.params, self.draft.manifest, self.stop_token_ids, self.remaining)
        async for tokens, finish in cloud_tokens(self.stub, request, self.timeout, self.stats):
            self.committed.extend(tokens)
            self.generated.extend(tokens)
            self.stats.cloud_only_tokens += len(tokens)
            self.finish_reason = finish
            yield tokens

    # ---- wire ----------------------------------------------------------------------------

    async def _send(self, call, message: pb.SessionRequest) -> None:
        self.stats.bytes_sent += message.ByteSize() + GRPC_FRAME_HEADER
        try:
            await asyncio.wait_for(call.write(message), self.timeout)
        except asyncio.InvalidStateError:
            # The stream ended between two writes (e.g. the replica died): report its status.
            raise await _ended(call) from None

    async def _receive(self, call) -> pb.SessionResponse:
        message = await asyncio.wait_for(call.read(), self.timeout)
        if message is grpc.aio.EOF:
            raise await _ended(call)
        self.stats.bytes_received += message.ByteSize() + GRPC_FRAME_HEADER
        return message


async def _ended(call) -> "_StreamEnded":
    """The error for a stream that ended early; without an error status it counts as dropped."""
    code, details = await call.code(), await call.details()
    return _StreamEnded(grpc.StatusCode.UNAVAILABLE if code == grpc.StatusCode.OK else code, details)


class _StreamEnded(grpc.RpcError):
    """The stream ended before the reply; without an error status it counts as dropped."""

    def __init__(self, code: grpc.StatusCode, details: str | None):
        super().__init__(details)
        self._code = code
        self._details = details or "the server ended the session stream unexpectedly"

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details
