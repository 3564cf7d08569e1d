"""The device's side of the wire: message writes and reads, byte counts, the retry decision."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from edgespec.edge.errors import CapacityError, InvalidRequestError, RequestTimeoutError, is_retryable
from edgespec.edge.stats import RequestStats
from edgespec.edge.transport import Retries, SessionStream, StreamEnded, backoff_s
from edgespec.edge.wire import GRPC_FRAME_HEADER
from edgespec.v1 import speculative_pb2 as pb


class EndedCall:
    """What grpc.aio does once a replica died between two rounds."""

    async def write(self, message):
        raise asyncio.InvalidStateError("RPC already finished.")

    async def read(self):
        return grpc.aio.EOF

    async def code(self):
        return grpc.StatusCode.INTERNAL

    async def details(self):
        return "The actor died unexpectedly before finishing this task."


class EchoCall:
    """A call that answers every write with a Verdict of the same round."""

    def __init__(self):
        self.written: list[pb.SessionRequest] = []

    async def write(self, message):
        self.written.append(message)

    async def read(self):
        return pb.SessionResponse(verdict=pb.Verdict(round=self.written[-1].draft.round, accepted=1, next_token=7))


class ClosedCleanly(EndedCall):
    async def code(self):
        return grpc.StatusCode.OK

    async def details(self):
        return ""


def test_a_write_to_a_stream_that_already_ended_raises_its_status_for_the_retry_logic():
    stream = SessionStream(EndedCall(), 1.0, RequestStats())
    message = pb.SessionRequest(draft=pb.Draft(round=4, token_ids=[1, 2]))
    with pytest.raises(grpc.RpcError) as caught:
        asyncio.run(stream.send(message))
    assert caught.value.code() == grpc.StatusCode.INTERNAL and is_retryable(caught.value)
    assert "actor died" in caught.value.details()


def test_a_stream_that_ends_without_an_error_counts_as_dropped():
    stream = SessionStream(ClosedCleanly(), 1.0, RequestStats())
    with pytest.raises(StreamEnded) as caught:
        asyncio.run(stream.receive())
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "unexpectedly" in caught.value.details()


def test_bytes_are_counted_as_they_cross_the_wire():
    stats = RequestStats()
    call = EchoCall()
    stream = SessionStream(call, 1.0, stats)
    message = pb.SessionRequest(draft=pb.Draft(round=3, token_ids=[1, 2, 300]))

    async def round_trip():
        await stream.send(message)
        return await stream.receive()

    reply = asyncio.run(round_trip())
    assert reply.verdict.round == 3
    assert stats.bytes_sent == message.ByteSize() + GRPC_FRAME_HEADER
    assert stats.bytes_received == reply.ByteSize() + GRPC_FRAME_HEADER


class Failed(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"failed with {self._code.name}"


def test_retries_give_up_after_the_budget_and_raise_the_typed_error():
    retries = Retries(max_retries=2, timeout=1.0)
    assert retries.next_delay(Failed(grpc.StatusCode.UNAVAILABLE)) > 0
    assert retries.next_delay(Failed(grpc.StatusCode.RESOURCE_EXHAUSTED)) > 0
    with pytest.raises(CapacityError):
        retries.next_delay(Failed(grpc.StatusCode.RESOURCE_EXHAUSTED))


def test_progress_resets_the_retry_budget():
    retries = Retries(max_retries=1, timeout=1.0)
    retries.next_delay(Failed(grpc.StatusCode.UNAVAILABLE))
    retries.progress()
    assert retries.next_delay(Failed(grpc.StatusCode.UNAVAILABLE)) > 0


def test_a_request_error_is_never_retried():
    with pytest.raises(InvalidRequestError):
        Retries(max_retries=5, timeout=1.0).next_delay(Failed(grpc.StatusCode.INVALID_ARGUMENT))


def test_a_timeout_becomes_a_request_timeout_error():
    retries = Retries(max_retries=0, timeout=2.5)
    with pytest.raises(RequestTimeoutError, match="2.5s"):
        retries.next_delay(asyncio.TimeoutError())


def test_backoff_grows_and_is_capped():
    assert all(0.1 <= backoff_s(1) <= 0.2 for _ in range(20))
    assert all(backoff_s(10, cap=5.0) <= 5.0 for _ in range(20))
    assert min(backoff_s(4) for _ in range(50)) > max(backoff_s(1) for _ in range(50))
