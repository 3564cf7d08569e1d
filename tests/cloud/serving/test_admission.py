"""Admission by sessions, KV bytes and key quota; everything taken is given back."""

from __future__ import annotations

import grpc
import pytest

from edgespec.cloud.serving.admission import Admission
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
