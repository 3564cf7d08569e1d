"""Wire messages to the verifier's session types and back."""

from __future__ import annotations

import grpc
import pytest

from edgespec.cloud.serving import codec
from edgespec.cloud.serving.session import Verdict
from edgespec.edge.errors import ServerError
from edgespec.edge.params import Finish, Mode
from edgespec.v1 import speculative_pb2 as pb


def test_open_is_decoded_field_by_field():
    message = pb.Open(prompt_ids=[3, 4], sampling=pb.SamplingParams(temperature=0.7, top_k=5, seed=9),
                      mode=pb.VERIFY_MODE_TOKEN, tokenizer_fingerprint="tok1-test-100-fp", max_new_tokens=12,
                      stop_token_ids=[0], first_round=6)
    request = codec.open_from_proto(message)
    assert request.prompt_ids == [3, 4] and request.mode is Mode.TOKEN and request.mode_number == pb.VERIFY_MODE_TOKEN
    assert request.sampling.temperature == pytest.approx(0.7) and request.sampling.top_k == 5 and request.sampling.seed == 9
    assert request.sampling.top_p == 1.0  # unset on the wire means off
    assert (request.max_new_tokens, request.stop_token_ids, request.first_round) == (12, [0], 6)


def test_an_unknown_mode_is_kept_for_the_session_to_refuse():
    request = codec.open_from_proto(pb.Open(prompt_ids=[1], mode=77))
    assert request.mode is None and request.mode_number == 77


def test_bad_sampling_is_invalid_argument_naming_the_field():
    with pytest.raises(ServerError) as caught:
        codec.open_from_proto(pb.Open(prompt_ids=[1], sampling=pb.SamplingParams(temperature=float("nan"))))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT and "sampling: temperature" in caught.value.details


def test_generate_is_a_session_that_never_drafts():
    greedy = codec.generate_from_proto(pb.GenerateRequest(prompt_ids=[1, 2], max_new_tokens=4))
    sampled = codec.generate_from_proto(pb.GenerateRequest(prompt_ids=[1], sampling=pb.SamplingParams(temperature=1.0)))
    assert greedy.mode is Mode.GREEDY and sampled.mode is Mode.COUPLED and greedy.max_new_tokens == 4  # cloud-only = coupled, k = 0


def test_draft_q_and_verdict():
    draft = pb.Draft(round=2, token_ids=[5], q=[pb.SparseDistribution(token_ids=[5, 6], probs=[0.5, 0.5])])
    assert codec.draft_q(draft) == [([5, 6], [0.5, 0.5])]
    reply = codec.verdict_to_proto(Verdict(3, 2, 8, Finish.STOP_TOKEN, batch_size=4, verify_ms=1.5)).verdict
    assert (reply.round, reply.accepted, reply.next_token, reply.finished) == (3, 2, 8, True)
    assert reply.finish_reason == pb.FINISH_REASON_STOP_TOKEN and reply.batch_size == 4
    assert not codec.verdict_to_proto(Verdict(3, 0, 8, Finish.NONE)).verdict.finished


def test_info_lists_the_modes_the_backend_serves():
    from types import SimpleNamespace

    from edgespec.cloud.serving.session import Limits
    from edgespec.edge.params import Mode

    config = SimpleNamespace(model_id="m", max_sessions=4, session_idle_timeout_s=30.0, first_message_timeout_s=10.0,
                             default_max_new_tokens=64, max_q_entries=1024)

    def modes(**served):
        limits = Limits(vocab_size=100, max_context=512, max_k=8, max_new_tokens=256, default_max_new_tokens=64,
                        tokenizer_fingerprint="fp", **served)
        return sorted(codec.info_to_proto(limits, config, version="v", forward_ms=0.0, decode_ms=0.0, stream_ms=0.0,
                                          max_message_bytes=1000, auth_required=False).modes)

    assert modes() == [pb.VERIFY_MODE_GREEDY, pb.VERIFY_MODE_EXACT, pb.VERIFY_MODE_TOKEN, pb.VERIFY_MODE_COUPLED]
    assert modes(modes=frozenset({Mode.GREEDY})) == [pb.VERIFY_MODE_GREEDY]


def test_a_draft_is_read_field_by_field():
    message = pb.Draft(round=3, token_ids=[4, 5], ahead=True, assumed_token=9, parents=[],
                       q=[pb.SparseDistribution(token_ids=[4], probs=[1.0]), pb.SparseDistribution(token_ids=[5, 6], probs=[0.5, 0.5])])
    draft = codec.draft_from_proto(message, max_q_entries=2)
    assert (draft.round_no, draft.tokens, draft.ahead, draft.assumed_token, draft.parents) == (3, [4, 5], True, 9, [])
    assert draft.q == [([4], [1.0]), ([5, 6], [0.5, 0.5])]
    with pytest.raises(ServerError, match="at most 1"):
        codec.draft_from_proto(message, max_q_entries=1)


def test_every_reply_the_verifier_sends_is_built_here():
    opened = codec.opened_to_proto("s1", max_k=8, max_context=512, max_new_tokens=64, model_id="m", replica_id="r").opened
    assert (opened.session_id, opened.max_k, opened.max_context, opened.replica_id) == ("s1", 8, 512, "r")
    closed = codec.closed_to_proto(3, 12).closed
    assert (closed.rounds, closed.generated_tokens) == (3, 12)
    reply = codec.generate_reply_to_proto(Verdict(0, 0, 7, Finish.LENGTH, batch_size=2, verify_ms=1.5), draining=False)
    assert (list(reply.token_ids), reply.finished, reply.finish_reason, reply.batch_size) == ([7], True, pb.FINISH_REASON_LENGTH, 2)


def test_info_tells_the_limits_and_the_diagnostics_only_when_given():
    from types import SimpleNamespace

    from edgespec.cloud.serving.session import Limits

    limits = Limits(vocab_size=100, max_context=512, max_k=8, max_new_tokens=256, default_max_new_tokens=64,
                    tokenizer_fingerprint="fp", max_tree_tokens=4)
    config = SimpleNamespace(model_id="m", max_sessions=4, session_idle_timeout_s=30.0, first_message_timeout_s=10.0,
                             default_max_new_tokens=64, max_q_entries=1024)
    public = codec.info_to_proto(limits, config, version="v", forward_ms=2.0, decode_ms=1.0, stream_ms=1.5,
                                 max_message_bytes=1000, auth_required=True)
    assert (public.vocab_size, public.max_tree_tokens, public.send_ahead, public.auth_required) == (100, 4, True, True)
    assert public.replica_id == "" and public.target_params == 0
    assert (public.decode_ms, public.stream_ms) == (1.0, 1.5)  # the costs a device's planner starts from, with or without a key
    diagnostics = codec.ReplicaDiagnostics(10, 20, 30, 1, 3, "r1")
    full = codec.info_to_proto(limits, config, version="v", forward_ms=2.0, decode_ms=1.0, stream_ms=1.5,
                               max_message_bytes=1000, auth_required=True, diagnostics=diagnostics)
    assert (full.target_params, full.free_sessions, full.replica_id) == (10, 3, "r1")
