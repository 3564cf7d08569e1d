"""The device's side of the wire: one Session stream, one Generate stream, and the retry decision.

No algorithm here: ``SessionStream`` writes and reads messages with a deadline per message and
counts their bytes; ``generate_tokens`` reads a Generate stream; ``Retries`` is the one place
that decides whether a failed attempt is tried again (after how long, over which connection) or
raised as a typed error. The driver (``edgespec.edge.driver``) uses all three.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol

import grpc

from edgespec.edge.errors import (
    DRAINING_MESSAGE,
    DRAINING_PATIENCE_S,
    DRAINING_RETRY_S,
    EdgespecError,
    RequestTimeoutError,
    from_rpc_error,
    is_retryable,
    status_error,
)
from edgespec.edge.stats import RequestStats
from edgespec.edge.wire import finish_name, wire_bytes
from edgespec.v1 import speculative_pb2 as pb

# What a stream's read returns after the last message. grpc.aio re-exports it from a compiled
# module (cygrpc) that has no stubs, so a static checker cannot see it.
EOF = grpc.aio.EOF  # pyright: ignore[reportAttributeAccessIssue] (defined in grpc's compiled cygrpc)


class Stub(Protocol):
    """The calls the loop makes: ``speculative_pb2_grpc.SpeculativeStub``'s streams (the clients
    pass ``aclient.KeyedStub``, which adds the API key to every call). The generated stub is
    untyped: each returns a grpc.aio call."""

    def Session(self, **kwargs: Any) -> Any: ...

    def Generate(self, request: pb.GenerateRequest, **kwargs: Any) -> Any: ...


def backoff_s(attempt: int, base: float = 0.2, cap: float = 5.0) -> float:
    """Exponential backoff with jitter for the attempt-th consecutive failure (1-based)."""
    return min(cap, base * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


def typed_error(error: BaseException, timeout: float) -> EdgespecError:
    """The SDK's error for a failed call (``error`` is an RpcError or a timeout)."""
    if isinstance(error, EdgespecError):
        return error
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        return RequestTimeoutError(f"no reply within {timeout:g}s")
    if isinstance(error, grpc.RpcError):
        return from_rpc_error(error)
    return status_error(grpc.StatusCode.UNKNOWN, str(error))  # (no status: as from_rpc_error reads one)


@dataclass(frozen=True)
class Retry:
    """What to do after a failed attempt: wait ``delay_s``, then open again with every committed
    token; with ``reroute``, over a fresh connection through the ingress (another replica should
    take the session: after a move, a draining refusal, or a full replica)."""

    delay_s: float
    reroute: bool
    cause: str  # "moved" (a draining replica said so), "draining" (an Open it refused), "failure"


class Retries:
    """The one retry decision: counts consecutive failed attempts; progress (a committed token)
    resets the count. ``clock`` (seconds) times a drain's patience."""

    def __init__(self, max_retries: int, timeout: float, *, clock: Callable[[], float] = time.monotonic):
        self.max_retries, self.timeout, self.clock = max_retries, timeout, clock
        self.failures = 0
        self._draining_since: float | None = None  # the first Open a draining replica refused

    def progress(self) -> None:
        self.failures = 0
        self._draining_since = None

    def decide(self, error: BaseException) -> Retry:
        """Raises the typed error when giving up.

        A session told to move (``ReplicaMoved``) reopens at once and counts no failure. An
        Open refused by a draining replica (the ingress had not taken it out yet) is tried
        again after a short pause, for as long as a drain lasts, and counts no failure either."""
        if isinstance(error, ReplicaMoved):
            return Retry(0.0, True, "moved")
        if is_draining_refusal(error):
            now = self.clock()
            self._draining_since = self._draining_since or now
            if now - self._draining_since <= DRAINING_PATIENCE_S:
                return Retry(DRAINING_RETRY_S * (0.5 + random.random() / 2), True, "draining")
        self.failures += 1
        if not is_retryable(error) or self.failures > self.max_retries:
            raise typed_error(error, self.timeout) from None
        full = isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        return Retry(backoff_s(self.failures), full, "failure")


class StreamEnded(grpc.RpcError):
    """The stream ended before the reply; without an error status it counts as dropped."""

    def __init__(self, code: grpc.StatusCode, details: str | None):
        super().__init__(details)
        self._code = code
        self._details = details or "the server ended the session stream unexpectedly"

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class ReplicaMoved(StreamEnded):
    """The replica is shutting down and said so with its last answer (``draining``): what it
    sent is committed; the generation goes on over a new stream, on another replica."""

    def __init__(self):
        super().__init__(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)


def is_draining_refusal(error: BaseException) -> bool:
    """An UNAVAILABLE from a replica that is shutting down (its message says so)."""
    return (isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.UNAVAILABLE
            and (error.details() or "").startswith(DRAINING_MESSAGE))


async def _ended(call) -> StreamEnded:
    code, details = await call.code(), await call.details()
    return StreamEnded(grpc.StatusCode.UNAVAILABLE if code == grpc.StatusCode.OK else code, details)


_DRAINING: set = set()  # streams being closed in the background (a reference keeps each task alive)


class SessionStream:
    """One Session bidi call; every write and read waits at most ``timeout`` seconds."""

    def __init__(self, call, timeout: float, stats: RequestStats):
        self.call, self.timeout, self.stats = call, timeout, stats
        self.closing: asyncio.Task | None = None

    async def send(self, message: pb.SessionRequest) -> None:
        self.stats.bytes_sent += wire_bytes(message)
        try:
            await asyncio.wait_for(self.call.write(message), self.timeout)
        except asyncio.InvalidStateError:
            # The stream ended between two writes (e.g. the replica died): report its status.
            raise await _ended(self.call) from None

    async def receive(self) -> pb.SessionResponse:
        message = await asyncio.wait_for(self.call.read(), self.timeout)
        if message is EOF:
            raise await _ended(self.call)
        self.stats.bytes_received += wire_bytes(message)
        return message

    async def done_writing(self) -> None:
        await self.call.done_writing()

    async def close(self, close_request: pb.SessionRequest) -> None:
        """Ends the session the polite way: Close, then the server's last messages are read in
        the background (verdicts of blocks still in flight, Closed) until the stream ends, so
        the server finishes a stream its client still holds instead of one it cancelled."""
        await self.send(close_request)
        await self.done_writing()
        self.closing = asyncio.get_running_loop().create_task(self._drain())
        _DRAINING.add(self.closing)
        self.closing.add_done_callback(_DRAINING.discard)

    async def _drain(self) -> None:
        try:
            # One deadline for the whole drain (asyncio.wait_for: asyncio.timeout is Python 3.11+).
            await asyncio.wait_for(self._read_to_end(), self.timeout)
        except (grpc.RpcError, asyncio.TimeoutError, asyncio.CancelledError):  # asyncio's: not a TimeoutError on 3.10
            pass
        finally:
            self.call.cancel()

    async def _read_to_end(self) -> None:
        while await self.call.read() is not EOF:
            pass

    def cancel(self) -> None:
        """Cancels the call, unless it is being closed the polite way (``close``)."""
        if self.closing is None:
            self.call.cancel()


async def generate_tokens(stub: Stub, request: pb.GenerateRequest, timeout: float,
                          stats: RequestStats) -> AsyncIterator[tuple[list[int], str, list[float] | None]]:
    """Reads a Generate call: yields (new tokens, finish reason or "", each token's p(t) or None)
    per message; None where the message carries no probability per token (greedy requests,
    older servers: ``GenerateResponse.token_probs``).

    Raises grpc.RpcError or asyncio.TimeoutError as they come; the caller decides on retries.
    """
    stats.bytes_sent += wire_bytes(request)
    call = stub.Generate(request)
    try:
        while True:
            reply = await asyncio.wait_for(call.read(), timeout)
            if reply is EOF:
                return
            stats.bytes_received += wire_bytes(reply)
            tokens = list(reply.token_ids)
            probs = list(reply.token_probs) if len(reply.token_probs) == len(tokens) and tokens else None
            yield tokens, finish_name(reply.finish_reason) if reply.finished else "", probs
            if reply.draining and not reply.finished:
                raise ReplicaMoved()
    finally:
        call.cancel()
