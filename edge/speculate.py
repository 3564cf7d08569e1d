"""The device's speculative loop over one gRPC session, with resume on a broken stream.

One round, top to bottom:

1. pick k (fixed or adaptive), draft k tokens with the ONNX draft;
2. send them as a Draft and wait for the Verdict (n accepted, next token);
3. commit drafts[:n] + [next], roll the draft's cache back to the committed tokens.

If the stream breaks (replica restart, dropped connection, timeout), a new session is opened
with every committed token as its prompt and the round numbering continued, so seeded draws
repeat and the output equals an uninterrupted run: no token is lost or repeated.
"""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import Executor
from typing import AsyncIterator

import grpc

from edgespec.edge.errors import RequestTimeoutError, from_rpc_error, is_retryable
from edgespec.edge.policy import make_policy
from edgespec.edge.sampling import SamplingParams, round_rng
from edgespec.edge.stats import RequestStats
from edgespec.edge.types import GenerationParams, ServerInfo
from edgespec.v1 import speculative_pb2 as pb
from edgespec.v1 import speculative_pb2_grpc as pb_grpc

WIRE_MODES = {"greedy": pb.VERIFY_MODE_GREEDY, "exact": pb.VERIFY_MODE_EXACT, "token": pb.VERIFY_MODE_TOKEN}
FINISH_NAMES = {
    pb.FINISH_REASON_STOP_TOKEN: "stop_token",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CONTEXT: "context",
}
GRPC_FRAME_HEADER = 5  # bytes before every gRPC message on the wire


def backoff_s(attempt: int, base: float = 0.2, cap: float = 5.0) -> float:
    """Exponential backoff with jitter for the attempt-th consecutive failure (1-based)."""
    return min(cap, base * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


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
        self.round_no = 0
        self.policy = make_policy(params.k, k_max=info.max_k)
        self.sampling = None
        if params.mode != "greedy":
            self.sampling = SamplingParams(
                temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=params.seed
            )
        stop = params.stop_token_ids
        self.stop_token_ids = list(draft.manifest.eos_token_ids if stop is None else stop)

    async def chunks(self) -> AsyncIterator[list[int]]:
        started = time.perf_counter()
        failures = 0
        try:
            while not self.finish_reason:
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
                    await asyncio.sleep(backoff_s(failures))
                finally:
                    call.cancel()
        finally:
            self.stats.wall_s = time.perf_counter() - started

    async def _session(self, call) -> AsyncIterator[list[int]]:
        remaining = self.params.max_new_tokens - len(self.generated)
        await self._send(
            call,
            pb.SessionRequest(
                open=pb.Open(
                    prompt_ids=self.committed,
                    sampling=pb.SamplingParams(
                        temperature=self.params.temperature,
                        top_k=self.params.top_k,
                        top_p=self.params.top_p,
                        seed=self.params.seed,
                    ),
                    mode=WIRE_MODES[self.params.mode],
                    tokenizer_fingerprint=self.draft.manifest.tokenizer_fingerprint,
                    max_new_tokens=remaining,
                    stop_token_ids=self.stop_token_ids,
                    first_round=self.round_no,
                )
            ),
        )
        opened = (await self._receive(call)).opened
        if self.draft.tokens[: len(self.committed)] == self.committed:
            self.draft.rollback_to(len(self.committed))  # keeps whatever cache is still valid
        else:
            self.draft.reset(self.committed)
        prefilled = False
        while True:
            # Step 1: draft k tokens on the device.
            room = opened.max_context - len(self.committed)
            budget = self.params.max_new_tokens - len(self.generated)
            k = self.policy.next_k(min(opened.max_k, room, max(1, budget - 1)))
            rng = round_rng(self.params.seed, self.round_no) if self.sampling else None
            top_n = self.params.top_n if self.params.mode == "exact" else 0
            t0 = time.perf_counter()
            proposal = await asyncio.get_running_loop().run_in_executor(
                self.draft_thread, lambda: self.draft.propose(k, self.sampling, rng, top_n)
            )
            t1 = time.perf_counter()
            # Step 2: send the block, wait for the verdict.
            draft_msg = pb.Draft(round=self.round_no, token_ids=proposal.tokens)
            if self.params.mode == "exact":
                draft_msg.q.extend(
                    pb.SparseDistribution(token_ids=d.token_ids.tolist(), probs=d.probs.tolist()) for d in proposal.q
                )
            await self._send(call, pb.SessionRequest(draft=draft_msg))
            verdict = (await self._receive(call)).verdict
            t2 = time.perf_counter()
            # Step 3: commit and roll the draft back to the committed tokens.
            n = verdict.accepted
            new_tokens = list(proposal.tokens[:n]) + [verdict.next_token]
            self.draft.rollback_to(len(self.committed) + n)
            self.draft.append([verdict.next_token])
            self.committed.extend(new_tokens)
            self.generated.extend(new_tokens)
            self.stats.record_round(k, n, len(new_tokens), batch_size=verdict.batch_size)
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

    async def _send(self, call, message: pb.SessionRequest) -> None:
        self.stats.bytes_sent += message.ByteSize() + GRPC_FRAME_HEADER
        await asyncio.wait_for(call.write(message), self.timeout)

    async def _receive(self, call) -> pb.SessionResponse:
        message = await asyncio.wait_for(call.read(), self.timeout)
        if message is grpc.aio.EOF:
            code = await call.code()
            details = await call.details()
            raise _StreamEnded(grpc.StatusCode.UNAVAILABLE if code == grpc.StatusCode.OK else code, details)
        self.stats.bytes_received += message.ByteSize() + GRPC_FRAME_HEADER
        return message


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
