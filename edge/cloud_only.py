"""Cloud-only generation (the Generate RPC): the baseline, the fallback, and the rest of a
generation once the draft's context is full.

The target decodes every token and streams it down. If the stream breaks, a new Generate call
continues from every token received so far (the prompt plus the generated tokens, with the
remaining budget), so no token is lost or repeated; retries follow ``transport.Retries``.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Sequence

import grpc

from edgespec.edge.params import SamplingParams
from edgespec.edge.stats import RequestStats
from edgespec.edge.transport import Retries, StreamEnded, generate_tokens
from edgespec.edge.wire import generate_request


class CloudOnlyRun:
    """One cloud-only generation; iterate ``chunks()`` for the tokens as they arrive."""

    def __init__(
        self,
        stub,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        fingerprint: str,
        *,
        max_new_tokens: int,
        stop_token_ids: Sequence[int],
        timeout: float,
        max_retries: int,
        stats: RequestStats | None = None,
    ):
        self.stub, self.sampling, self.fingerprint = stub, sampling, fingerprint
        self.committed = list(prompt_ids)
        self.max_new_tokens, self.stop_token_ids = max_new_tokens, list(stop_token_ids)
        self.timeout, self.max_retries = timeout, max_retries
        self.stats = stats if stats is not None else RequestStats(seed=None if sampling.is_greedy else sampling.seed)
        self.generated: list[int] = []
        self.finish_reason = ""

    async def chunks(self) -> AsyncIterator[list[int]]:
        retries = Retries(self.max_retries, self.timeout, self.stats, reroute=getattr(self.stub, "reconnect", None))
        started = time.perf_counter()
        while not self.finish_reason:
            request = generate_request(
                self.committed, self.sampling, self.fingerprint,
                max_new_tokens=self.max_new_tokens - len(self.generated), stop_token_ids=self.stop_token_ids,
                first_round=len(self.generated),  # one round of draws per token: a resume draws on
            )
            try:
                async for tokens, finish in generate_tokens(self.stub, request, self.timeout, self.stats):
                    if tokens and not self.stats.first_token_s:
                        self.stats.first_token_s = time.perf_counter() - started
                    self.committed.extend(tokens)
                    self.generated.extend(tokens)
                    self.stats.generated += len(tokens)
                    self.stats.target_calls += len(tokens)
                    self.finish_reason = finish
                    if tokens:
                        retries.progress()
                    yield tokens
                if not self.finish_reason:  # the stream ended without saying why: a drop
                    raise StreamEnded(grpc.StatusCode.UNAVAILABLE, "the Generate stream ended before its last token")
            except (grpc.RpcError, asyncio.TimeoutError) as exc:
                await retries.wait(exc)  # raises the typed error when giving up
