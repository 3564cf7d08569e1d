"""A session's state machine: limits (stop tokens, length, context) and draft validation."""

from __future__ import annotations

import grpc
import pytest

from edgespec.cloud.serving.session import Limits, OpenRequest, check_draft, open_session, commit_round
from edgespec.edge.errors import ServerError
from edgespec.edge.params import Finish, Mode, SamplingParams

LIMITS = Limits(vocab_size=100, max_context=50, max_k=8, max_new_tokens=40, default_max_new_tokens=20, tokenizer_fingerprint="tok1-test-100-fp")


def new_session(prompt=(1, 2, 3), max_new_tokens=0, stop=(), mode=Mode.GREEDY):
    request = OpenRequest(
        prompt_ids=list(prompt),
        sampling=SamplingParams(temperature=0.0 if mode is Mode.GREEDY else 1.0),
        mode=mode,
        mode_number=1,
        tokenizer_fingerprint="tok1-test-100-fp",
        max_new_tokens=max_new_tokens,
        stop_token_ids=list(stop),
    )
    return open_session(request, LIMITS)


def test_open_uses_server_default_length():
    assert new_session().max_new_tokens == 20
    assert new_session(max_new_tokens=7).max_new_tokens == 7


def test_commit_round_plain_round():
    state = new_session()
    assert commit_round(state, [5, 6, 7], 2, 9) == (2, 9, Finish.NONE)
    assert state.committed == [1, 2, 3, 5, 6, 9] and state.generated == 3 and state.next_round == 1


def test_stop_token_among_accepted_drafts_ends_there():
    state = new_session(stop=(6,))
    assert commit_round(state, [5, 6, 7], 3, 9) == (1, 6, Finish.STOP_TOKEN)
    assert state.committed[-2:] == [5, 6] and state.finished


def test_stop_token_as_next_token():
    state = new_session(stop=(9,))
    assert commit_round(state, [5, 6], 1, 9) == (1, 9, Finish.STOP_TOKEN)


def test_length_budget_cuts_the_round():
    state = new_session(max_new_tokens=4)
    commit_round(state, [5], 1, 6)  # 2 generated
    assert commit_round(state, [7, 8, 9], 3, 10) == (1, 8, Finish.LENGTH)
    assert state.generated == 4


def test_stop_token_past_the_budget_is_cut_off():
    state = new_session(max_new_tokens=2, stop=(7,))
    assert commit_round(state, [5, 6, 7], 3, 8) == (1, 6, Finish.LENGTH)


def test_context_limit():
    state = new_session(prompt=list(range(1, 48)), max_new_tokens=40)  # 47 tokens, room for 3
    assert commit_round(state, [5, 6, 7], 3, 8) == (2, 7, Finish.CONTEXT)
    assert len(state.committed) == LIMITS.max_context


def test_check_draft_refuses_past_context_and_after_finish():
    state = new_session(prompt=list(range(1, 48)))
    with pytest.raises(ServerError) as caught:
        check_draft(state, 0, [1, 2, 3, 4], [])
    assert caught.value.code == grpc.StatusCode.OUT_OF_RANGE
    state = new_session(max_new_tokens=1)
    commit_round(state, [5], 0, 6)
    with pytest.raises(ServerError) as caught:
        check_draft(state, 1, [1], [])
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_exact_q_is_renormalised_within_tolerance():
    state = new_session(mode=Mode.EXACT)
    block = check_draft(state, 0, [4], [([4, 5], [0.5, 0.5002])])
    (ids, probs), = block.q
    assert ids == [4, 5] and abs(sum(probs) - 1.0) < 1e-12 and probs[0] > 0


# ---- blocks sent ahead ---------------------------------------------------------------------


def test_an_ahead_block_is_verified_only_when_its_assumption_held():
    state = new_session(prompt=(1, 2, 3), max_new_tokens=30)
    commit_round(state, [5, 6], 2, 7)  # round 0 accepted both drafts, bonus 7
    state.last_full = True  # (the verifier sets it from the raw verdict)
    block = check_draft(state, 1, [8, 9], [], ahead=True, assumed_token=7)
    assert block is not None and block.ahead and block.tokens == [8, 9]
    assert check_draft(state, 1, [8, 9], [], ahead=True, assumed_token=6) is None  # wrong bonus guess
    assert check_draft(state, 2, [8, 9], [], ahead=True, assumed_token=7) is None  # not the next round
    state.last_full = False
    assert check_draft(state, 1, [8, 9], [], ahead=True, assumed_token=7) is None  # previous round rejected a draft


def test_a_stale_ahead_block_after_the_end_is_discarded_not_refused():
    state = new_session(max_new_tokens=1)
    commit_round(state, [5], 0, 6)
    assert state.finished
    assert check_draft(state, 1, [8], [], ahead=True, assumed_token=6) is None


def test_an_ahead_block_is_still_validated():
    state = new_session()
    with pytest.raises(ServerError) as caught:
        check_draft(state, 0, [1000], [], ahead=True, assumed_token=3)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ServerError):
        check_draft(state, 0, list(range(9)), [], ahead=True, assumed_token=3)  # k > max_k


# ---- tree drafts ---------------------------------------------------------------------------

TREE_LIMITS = Limits(vocab_size=100, max_context=50, max_k=4, max_new_tokens=40, default_max_new_tokens=20,
                     tokenizer_fingerprint="tok1-test-100-fp", max_tree_tokens=6)


def tree_session(mode=Mode.GREEDY, limits=TREE_LIMITS):
    request = OpenRequest(prompt_ids=[1, 2, 3], sampling=SamplingParams(temperature=0.0 if mode is Mode.GREEDY else 1.0),
                          mode=mode, mode_number=1, tokenizer_fingerprint="tok1-test-100-fp", max_new_tokens=0, stop_token_ids=[])
    return open_session(request, limits)


def test_a_valid_tree_is_accepted():
    block = check_draft(tree_session(), 0, [5, 6, 7, 8], [], parents=[-1, 0, 1, -1])
    assert block.parents == [-1, 0, 1, -1] and block.tokens == [5, 6, 7, 8]


@pytest.mark.parametrize("tokens, parents, message", [
    ([5, 6], [-1], "one parent index per token"),
    ([5, 6], [-1, 1], "a parent is -1"),
    ([5, 6], [-1, -2], "a parent is -1"),
    ([5, 5], [-1, -1], "siblings must differ"),
    ([1, 2, 3, 4, 5, 6, 7], [-1, 0, 1, 2, 3, 4, 5], "max_tree_tokens"),
    ([1, 2, 3, 4, 5], [-1, 0, 1, 2, 3], "deep"),
    ([1000], [-1], "vocabulary"),
])
def test_bad_trees_are_refused_naming_the_problem(tokens, parents, message):
    with pytest.raises(ServerError, match=message) as caught:
        check_draft(tree_session(), 0, tokens, [], parents=parents)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_trees_are_greedy_chains_when_sent_ahead_and_off_when_the_server_says_so():
    with pytest.raises(ServerError, match="greedy mode only"):
        check_draft(tree_session(Mode.TOKEN), 0, [5], [], parents=[-1])
    with pytest.raises(ServerError, match="must be a chain"):
        check_draft(tree_session(), 0, [5], [], ahead=True, assumed_token=3, parents=[-1])
    with pytest.raises(ServerError, match="chains only"):
        check_draft(new_session(), 0, [5], [], parents=[-1])  # LIMITS.max_tree_tokens == 0
