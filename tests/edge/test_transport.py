"""The device's side of the wire: message writes and reads, byte counts, the retry decision."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from edgespec.edge.errors import (
    CapacityError,
    ConnectionFailedError,
    InternalServerError,
    InvalidRequestError,
    RequestTimeoutError,
    is_retryable,
)
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
    assert retries.decide(Failed(grpc.StatusCode.UNAVAILABLE)).delay_s > 0
    assert retries.decide(Failed(grpc.StatusCode.RESOURCE_EXHAUSTED)).delay_s > 0
    with pytest.raises(CapacityError):
        retries.decide(Failed(grpc.StatusCode.RESOURCE_EXHAUSTED))


def test_progress_resets_the_retry_budget():
    retries = Retries(max_retries=1, timeout=1.0)
    retries.decide(Failed(grpc.StatusCode.UNAVAILABLE))
    retries.progress()
    assert retries.decide(Failed(grpc.StatusCode.UNAVAILABLE)).delay_s > 0


def test_a_request_error_is_never_retried():
    with pytest.raises(InvalidRequestError):
        Retries(max_retries=5, timeout=1.0).decide(Failed(grpc.StatusCode.INVALID_ARGUMENT))


def test_a_timeout_becomes_a_request_timeout_error():
    retries = Retries(max_retries=0, timeout=2.5)
    with pytest.raises(RequestTimeoutError, match="2.5s"):
        retries.decide(asyncio.TimeoutError())


def test_a_message_timeout_is_retried_on_every_python():
    # asyncio.wait_for raises asyncio.TimeoutError, which is a TimeoutError only from 3.11.
    assert is_retryable(asyncio.TimeoutError())
    assert Retries(max_retries=1, timeout=1.0).decide(asyncio.TimeoutError()).cause == "failure"


class EndlessCall(EchoCall):
    """A call whose server keeps answering after Close and never ends the stream."""

    def __init__(self):
        super().__init__()
        self.cancelled = False

    async def done_writing(self):
        pass

    async def read(self):
        await asyncio.sleep(0.02)
        return pb.SessionResponse()

    def cancel(self):
        self.cancelled = True


def test_a_polite_close_reads_for_at_most_the_timeout_then_cancels_the_call():
    call = EndlessCall()
    stream = SessionStream(call, 0.2, RequestStats())

    async def close():
        loop = asyncio.get_running_loop()
        started = loop.time()
        await stream.close(pb.SessionRequest(close=pb.Close()))
        assert stream.closing is not None
        await stream.closing  # the drain's timeout is swallowed: the session already ended
        return loop.time() - started

    elapsed = asyncio.run(close())
    assert 0.15 <= elapsed < 1.0 and call.cancelled


def test_backoff_grows_and_is_capped():
    assert all(0.1 <= backoff_s(1) <= 0.2 for _ in range(20))
    assert all(backoff_s(10, cap=5.0) <= 5.0 for _ in range(20))
    assert min(backoff_s(4) for _ in range(50)) > max(backoff_s(1) for _ in range(50))


# ---- a replica that drains (scale-down, redeploy) ----------------------------------------------


def draining_refusal() -> StreamEnded:
    from edgespec.edge.errors import DRAINING_MESSAGE

    return StreamEnded(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)


def test_a_moved_session_reopens_at_once_elsewhere_and_counts_no_failure():
    from edgespec.edge.transport import ReplicaMoved

    retries = Retries(0, 1.0)  # no retries allowed for failures: a move is none
    retry = retries.decide(ReplicaMoved())
    assert (retry.delay_s, retry.reroute, retry.cause, retries.failures) == (0.0, True, "moved", 0)


def test_an_open_refused_while_draining_is_retried_soon_without_using_up_retries():
    from edgespec.edge.errors import DRAINING_RETRY_S

    retries = Retries(1, 1.0)
    delays = [retries.decide(draining_refusal()).delay_s for _ in range(20)]
    assert all(0 < d <= DRAINING_RETRY_S for d in delays)
    assert retries.failures == 0
    with pytest.raises(CapacityError):  # other failures still count against max_retries
        retries.decide(StreamEnded(grpc.StatusCode.RESOURCE_EXHAUSTED, "full"))
        retries.decide(StreamEnded(grpc.StatusCode.RESOURCE_EXHAUSTED, "full"))


def test_draining_refusals_stop_being_retried_after_the_patience():
    import edgespec.edge.transport as transport

    clock = [100.0]
    retries = Retries(0, 1.0, clock=lambda: clock[0])
    retries.decide(draining_refusal())
    clock[0] += transport.DRAINING_PATIENCE_S + 1
    with pytest.raises(Exception, match="shutting down"):
        retries.decide(draining_refusal())


def generate_stub(replies: list):
    """A stub whose Generate call reads ``replies`` in order, then the end of the stream."""
    class Call:
        async def read(self):
            return replies.pop(0) if replies else grpc.aio.EOF

        def cancel(self):
            pass

    class Stub:
        def Generate(self, request):
            return Call()

    return Stub()


def test_a_generate_message_that_says_draining_commits_its_tokens_then_moves():
    from edgespec.edge.transport import ReplicaMoved, generate_tokens

    stub = generate_stub([pb.GenerateResponse(token_ids=[5]), pb.GenerateResponse(token_ids=[6], draining=True)])

    async def read():
        got = []
        with pytest.raises(ReplicaMoved):
            async for tokens, _, _ in generate_tokens(stub, pb.GenerateRequest(), 1.0, RequestStats()):
                got.extend(tokens)
        return got

    assert asyncio.run(read()) == [5, 6]


def test_a_generate_message_hands_on_its_tokens_probabilities_only_when_there_is_one_per_token():
    """``GenerateResponse.token_probs`` (p of each token, sampled requests): passed on with the
    tokens; a message without them (greedy, an older server), or with a count that does not
    match its tokens, gives None (the shadow then falls back to q(t) alone)."""
    from edgespec.edge.transport import generate_tokens

    stub = generate_stub([pb.GenerateResponse(token_ids=[5], token_probs=[0.5]), pb.GenerateResponse(token_ids=[6]),
                          pb.GenerateResponse(token_ids=[7, 8], token_probs=[0.25]),
                          pb.GenerateResponse(token_ids=[9], token_probs=[0.75], finished=True)])

    async def read():
        return [(tokens, probs) async for tokens, _, probs in generate_tokens(stub, pb.GenerateRequest(), 1.0, RequestStats())]

    assert asyncio.run(read()) == [([5], [0.5]), ([6], None), ([7, 8], None), ([9], [0.75])]


def test_sessions_go_elsewhere_on_a_fresh_connection_after_a_move_a_draining_refusal_or_a_full_replica():
    from edgespec.edge.transport import ReplicaMoved

    retries = Retries(5, 1.0)
    for error in (ReplicaMoved(), draining_refusal(), StreamEnded(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")):
        assert retries.decide(error).reroute
    assert not retries.decide(StreamEnded(grpc.StatusCode.UNAVAILABLE, "connection reset")).reroute  # same ingress


def test_reconnect_moves_later_calls_to_a_new_channel_and_retires_the_old_one():
    from edgespec.edge.aclient import KeyedStub

    class Channel:
        made = 0

        def __init__(self):
            Channel.made += 1
            self.closed = False

        def unary_unary(self, *args, **kwargs):
            return lambda *a, **k: None

        unary_stream = stream_stream = stream_unary = unary_unary

        async def close(self):
            self.closed = True

    async def scenario():
        stub = KeyedStub(Channel, None)
        first = stub.channel
        stub.RECONNECT_EVERY_S = 0.0
        stub.reconnect()
        assert stub.channel is not first and not first.closed  # streams on it go on
        stub.reconnect()
        await stub.close()
        return first

    first = asyncio.run(scenario())
    assert first.closed and Channel.made == 3


def test_a_send_that_failed_in_grpcs_core_is_a_lost_connection_not_a_server_error():
    """grpc.aio marks a call whose write failed on a cut connection INTERNAL "Internal error from
    Core"; with no retries left the SDK raises ConnectionFailedError (the server never said it)."""
    cut = grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(),
        "Internal error from Core", 'Failed "execute_batch": (SendMessageOperation,)')
    with pytest.raises(ConnectionFailedError, match="connection broke while sending"):
        Retries(0, 1.0).decide(cut)
    server_side = grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "verifier crashed")
    with pytest.raises(InternalServerError):
        Retries(0, 1.0).decide(server_side)
