"""Admission by sessions, KV bytes and key quota, and the bound on streams waiting for their
Open; everything taken is given back."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from edgespec.cloud.serving.admission import Admission, PendingOpens
from edgespec.cloud.serving.auth import ApiKey, digest
from edgespec.cloud.serving.session import Limits, OpenRequest, open_session
from edgespec.edge.errors import ServerError
from edgespec.edge.params import Mode, SamplingParams

LIMITS = Limits(vocab_size=100, max_context=100, max_k=4, max_new_tokens=80, default_max_new_tokens=20, tokenizer_fingerprint="tok1-test-100-fp")


def state(prompt: int = 10, new: int = 20):
    request = OpenRequest(prompt_ids=[1] * prompt, sampling=SamplingParams(), mode=Mode.GREEDY, mode_number=1,
                          tokenizer_fingerprint="tok1-test-100-fp", max_new_tokens=new, stop_token_ids=[])
    return open_session(request, LIMITS)


def test_kv_reservation_is_prompt_plus_budget_within_the_context():
    admission = Admission(max_sessions=4, max_kv_bytes=10_000, kv_bytes_per_token=10)
    assert admission.reservation(state(10, 20)) == 300
    assert admission.reservation(state(90, 80)) == 1000  # capped at max_context


def test_sessions_and_bytes_are_both_budgets():
    admission = Admission(max_sessions=2, max_kv_bytes=1000, kv_bytes_per_token=10)
    first, second = state(), state()
    admission.acquire(first, None)
    admission.acquire(second, None)
    with pytest.raises(ServerError, match="capacity") as caught:
        admission.acquire(state(), None)
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    admission.release(first)
    with pytest.raises(ServerError, match="KV cache budget"):
        admission.acquire(state(90, 80), None)  # 1000 bytes: 300 are taken
    admission.release(second)
    admission.release(second)  # a second release changes nothing
    assert (admission.active, admission.reserved_bytes, admission.free_sessions) == (0, 0, 2)


def test_a_key_quota_refusal_takes_nothing():
    admission = Admission(max_sessions=4, max_kv_bytes=10_000, kv_bytes_per_token=10)
    key = ApiKey("a", digest("es-a"), max_sessions=1)
    admission.acquire(state(), key)
    with pytest.raises(ServerError, match="'a'"):
        admission.acquire(state(), key)
    assert admission.active == 1 and admission.reserved_bytes == 300


def test_a_paged_reservation_is_whole_pages_and_one_rounds_drafts():
    admission = Admission(max_sessions=4, max_kv_bytes=10_000, kv_bytes_per_token=10, page_tokens=16, round_tokens=5)
    assert admission.reservation(state(10, 20)) == 3 * 16 * 10  # 35 tokens: 3 pages
    assert admission.reservation(state(90, 80)) == 7 * 16 * 10  # 100 + 5 tokens: 7 pages



def test_a_keys_streams_waiting_for_their_open_are_bounded():
    pending = PendingOpens(max_streams=10, max_per_key=2)
    a, b = ApiKey("a", digest("es-a")), ApiKey("b", digest("es-b"))
    with pending.waiting(a), pending.waiting(a):
        with pytest.raises(ServerError, match="key 'a' has 2 streams waiting") as caught:
            with pending.waiting(a):
                pass
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry after" in caught.value.details
        with pending.waiting(b), pending.waiting(None):  # another key's room is its own; keyless streams have none
            assert pending.count == 4 and pending.refused == 1
    assert pending.count == 0 and not pending._per_key


def test_over_the_replicas_bound_the_oldest_waiting_stream_is_shed():
    async def scenario():
        pending = PendingOpens(max_streams=2, max_per_key=2)
        key = ApiKey("a", digest("es-a"))

        async def silent(started: asyncio.Event):
            with pending.waiting(key) as place:
                async with asyncio.timeout(60) as deadline:
                    place.deadline = deadline
                    started.set()
                    await asyncio.Event().wait()  # never sends

        oldest_started, next_started = asyncio.Event(), asyncio.Event()
        oldest = asyncio.create_task(silent(oldest_started))
        await oldest_started.wait()
        newer = asyncio.create_task(silent(next_started))
        await next_started.wait()
        with pending.waiting(None) as newest:  # a third stream: the oldest makes room at once
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(oldest, 5)
            assert pending.count == 2 and pending.shed == 1 and not newest.shed
            assert not newer.done() and pending._per_key == {"a": 1}
        newer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await newer
        assert pending.count == 0 and not pending._per_key

    asyncio.run(scenario())


def test_a_stream_that_ends_while_waiting_gives_its_place_back():
    pending = PendingOpens(max_streams=1, max_per_key=1)
    with pytest.raises(TimeoutError):
        with pending.waiting(None):
            raise TimeoutError  # the first-message deadline, or a cancelled stream
    with pending.waiting(None):
        assert pending.count == 1
    assert pending.count == 0


def test_pending_bounds_are_validated():
    with pytest.raises(ValueError, match="max_pending_streams"):
        PendingOpens(max_streams=0, max_per_key=1)
