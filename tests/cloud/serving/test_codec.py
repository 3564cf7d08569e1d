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


def test_info_lists_every_mode():
    assert sorted(codec.SERVED_MODES) == [pb.VERIFY_MODE_GREEDY, pb.VERIFY_MODE_EXACT, pb.VERIFY_MODE_TOKEN, pb.VERIFY_MODE_COUPLED]
