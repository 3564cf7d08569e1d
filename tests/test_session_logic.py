"""Pure logic: session limits (stop tokens, length, context), k policies, request statistics."""

from __future__ import annotations

import grpc
import pytest

from edgespec.cloud.sampling import Sampling
from edgespec.cloud.session import Finish, Limits, Mode, OpenRequest, SessionError, check_draft, open_session, settle
from edgespec.edge.policy import AdaptiveK, FixedK, expected_tokens, make_policy
from edgespec.edge.stats import RequestStats

LIMITS = Limits(vocab_size=100, max_context=50, max_k=8, max_new_tokens=40, default_max_new_tokens=20, tokenizer_fingerprint="fp")


def new_session(prompt=(1, 2, 3), max_new_tokens=0, stop=(), mode=Mode.GREEDY):
    request = OpenRequest(
        prompt_ids=list(prompt),
        sampling=Sampling(temperature=0.0 if mode is Mode.GREEDY else 1.0),
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
    with pytest.raises(SessionError) as caught:
        check_draft(state, 0, [1, 2, 3, 4], [])
    assert caught.value.code == grpc.StatusCode.OUT_OF_RANGE
    state = new_session(max_new_tokens=1)
    settle(state, [5], 0, 6)
    with pytest.raises(SessionError) as caught:
        check_draft(state, 1, [1], [])
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_exact_q_is_renormalised_within_tolerance():
    state = new_session(mode=Mode.EXACT)
    block = check_draft(state, 0, [4], [([4, 5], [0.5, 0.5002])])
    (ids, probs), = block.q
    assert ids == [4, 5] and abs(sum(probs) - 1.0) < 1e-12 and probs[0] > 0


# ---- k policies ----------------------------------------------------------------------------


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_fixed_k_respects_limit():
    assert FixedK(5).next_k(3) == 3 and FixedK(5).next_k(10) == 5
    with pytest.raises(ValueError):
        FixedK(0)


def train(policy: AdaptiveK, alpha_pattern, rounds=60, k=4):
    for i in range(rounds):
        accepted = alpha_pattern(i, k)
        policy.update(k, accepted, draft_ms=0.5 * k, wait_ms=10.0 + 0.5 * k)


def test_adaptive_k_lengthens_when_acceptance_is_high_and_shortens_when_low():
    high, low = AdaptiveK(), AdaptiveK()
    train(high, lambda i, k: k if i % 10 else k - 1)  # ~97% per-token acceptance
    train(low, lambda i, k: 0 if i % 2 else 1)  # ~33%
    assert high.alpha > 0.9 and low.alpha < 0.4
    assert high.next_k(16) > 6
    assert low.next_k(16) <= 2


def test_adaptive_k_draft_cost_matters():
    cheap, costly = AdaptiveK(initial_draft_ms=0.1), AdaptiveK(initial_draft_ms=20.0)
    assert cheap.next_k(16) > costly.next_k(16)


def test_make_policy():
    assert isinstance(make_policy("auto"), AdaptiveK)
    assert make_policy("3").next_k(8) == 3
    with pytest.raises(ValueError):
        make_policy("many")


# ---- statistics ----------------------------------------------------------------------------


def test_stats_rates():
    stats = RequestStats()
    stats.record_round(4, 4, 5)
    stats.record_round(4, 1, 2)
    stats.record_round(2, 0, 1)
    stats.wall_s = 0.8
    assert stats.acceptance_rate == pytest.approx(5 / 10)
    assert stats.mean_acceptance_length == pytest.approx(8 / 3)
    assert stats.acceptance_by_position == pytest.approx([2 / 3, 1 / 3, 1 / 2, 1 / 2])
    assert stats.target_calls_per_token == pytest.approx(3 / 8)
    assert stats.ms_per_token == pytest.approx(100.0)
    assert "mean acceptance length 2.67" in stats.summary()


def test_stats_combined_weighs_every_round_alike():
    a, b = RequestStats(), RequestStats()
    a.record_round(4, 4, 5)
    a.wall_s = 0.05
    b.record_round(2, 0, 1)
    b.record_round(2, 1, 2)
    b.wall_s = 0.25
    both = RequestStats.combined([a, b])
    assert (both.rounds, both.drafted, both.accepted, both.generated) == (3, 8, 5, 8)
    assert both.acceptance_by_position == pytest.approx([2 / 3, 1 / 3, 1.0, 1.0])
    assert both.mean_acceptance_length == pytest.approx(8 / 3)
    assert both.ms_per_token == pytest.approx(1000 * 0.3 / 8)
    assert both.k_history == [4, 2, 2]
    assert a.drafted_at == [1, 1, 1, 1]  # the inputs are left alone


def test_a_write_to_a_stream_that_already_ended_raises_its_status_for_the_retry_logic():
    import asyncio
    from types import SimpleNamespace

    from edgespec.edge.errors import is_retryable
    from edgespec.edge.speculate import SpeculativeRun
    from edgespec.v1 import speculative_pb2 as pb

    class EndedCall:  # what grpc.aio does once a replica died between two rounds
        async def write(self, message):
            raise asyncio.InvalidStateError("RPC already finished.")

        async def code(self):
            return grpc.StatusCode.INTERNAL

        async def details(self):
            return "The actor died unexpectedly before finishing this task."

    run = SimpleNamespace(stats=RequestStats(), timeout=1.0)
    message = pb.SessionRequest(draft=pb.Draft(round=4, token_ids=[1, 2]))
    with pytest.raises(grpc.RpcError) as caught:
        asyncio.run(SpeculativeRun._send(run, EndedCall(), message))
    assert caught.value.code() == grpc.StatusCode.INTERNAL and is_retryable(caught.value)
    assert "actor died" in str(caught.value)
