"""A session's state machine: limits (stop tokens, length, context) and draft validation."""

from __future__ import annotations

import grpc
import pytest

from edgespec.cloud.serving.session import Limits, OpenRequest, check_draft, open_session, settle
from edgespec.edge.errors import ServerError
from edgespec.edge.params import Finish, Mode, SamplingParams

LIMITS = Limits(vocab_size=100, max_context=50, max_k=8, max_new_tokens=40, default_max_new_tokens=20, tokenizer_fingerprint="fp")


def new_session(prompt=(1, 2, 3), max_new_tokens=0, stop=(), mode=Mode.GREEDY):
    request = OpenRequest(
        prompt_ids=list(prompt),
        sampling=SamplingParams(temperature=0.0 if mode is Mode.GREEDY else 1.0),
        mode=mode,
        mode_number=1,
        tokenizer_fingerprint="fp",
        max_new_tokens=max_new_tokens,
        stop_token_ids=list(stop),
    )
    return open_session(request, LIMITS)


def test_open_uses_server_default_length():
    assert new_session().max_new_tokens == 20
    assert new_session(max_new_tokens=7).max_new_tokens == 7


def test_settle_plain_round():
    state = new_session()
    assert settle(state, [5, 6, 7], 2, 9) == (2, 9, Finish.NONE)
    assert state.committed == [1, 2, 3, 5, 6, 9] and state.generated == 3 and state.next_round == 1


def test_stop_token_among_accepted_drafts_ends_there():
    state = new_session(stop=(6,))
    assert settle(state, [5, 6, 7], 3, 9) == (1, 6, Finish.STOP_TOKEN)
    assert state.committed[-2:] == [5, 6] and state.finished


def test_stop_token_as_next_token():
    state = new_session(stop=(9,))
    assert settle(state, [5, 6], 1, 9) == (1, 9, Finish.STOP_TOKEN)


def test_length_budget_cuts_the_round():
    state = new_session(max_new_tokens=4)
    settle(state, [5], 1, 6)  # 2 generated
    assert settle(state, [7, 8, 9], 3, 10) == (1, 8, Finish.LENGTH)
    assert state.generated == 4


def test_stop_token_past_the_budget_is_cut_off():
    state = new_session(max_new_tokens=2, stop=(7,))
    assert settle(state, [5, 6, 7], 3, 8) == (1, 6, Finish.LENGTH)


def test_context_limit():
    state = new_session(prompt=list(range(1, 48)), max_new_tokens=40)  # 47 tokens, room for 3
    assert settle(state, [5, 6, 7], 3, 8) == (2, 7, Finish.CONTEXT)
    assert len(state.committed) == LIMITS.max_context


def test_check_draft_refuses_past_context_and_after_finish():
    state = new_session(prompt=list(range(1, 48)))
    with pytest.raises(ServerError) as caught:
        check_draft(state, 0, [1, 2, 3, 4], [])
    assert caught.value.code == grpc.StatusCode.OUT_OF_RANGE
    state = new_session(max_new_tokens=1)
    settle(state, [5], 0, 6)
    with pytest.raises(ServerError) as caught:
        check_draft(state, 1, [1], [])
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_exact_q_is_renormalised_within_tolerance():
    state = new_session(mode=Mode.EXACT)
    block = check_draft(state, 0, [4], [([4, 5], [0.5, 0.5002])])
    (ids, probs), = block.q
    assert ids == [4, 5] and abs(sum(probs) - 1.0) < 1e-12 and probs[0] > 0
