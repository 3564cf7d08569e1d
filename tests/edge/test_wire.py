"""The codec between the shared types and the contract: one mapping both sides use."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.edge.params import Finish, Mode, SamplingParams
from edgespec.edge.sampling import SparseDist
from edgespec.edge.wire import (
    FINISH_FROM_WIRE,
    FINISH_TO_WIRE,
    GRPC_FRAME_HEADER,
    MODE_FROM_WIRE,
    MODE_TO_WIRE,
    draft_request,
    finish_name,
    generate_request,
    open_request,
    sampling_from_proto,
    sampling_to_proto,
    server_info,
    wire_bytes,
)
from edgespec.v1 import speculative_pb2 as pb


def test_every_mode_and_finish_has_its_own_wire_number():
    assert set(MODE_TO_WIRE) == set(Mode) and len(set(MODE_TO_WIRE.values())) == len(Mode)
    assert pb.VERIFY_MODE_UNSPECIFIED not in MODE_FROM_WIRE
    assert set(FINISH_TO_WIRE) == set(Finish) and FINISH_TO_WIRE[Finish.NONE] == pb.FINISH_REASON_UNSPECIFIED
    for finish, number in FINISH_TO_WIRE.items():
        assert FINISH_FROM_WIRE[number] is finish


def test_sampling_round_trips_and_top_p_zero_means_off():
    params = SamplingParams(temperature=0.75, top_k=40, top_p=0.5, seed=2**40)
    assert sampling_from_proto(sampling_to_proto(params)) == params
    assert sampling_from_proto(pb.SamplingParams(temperature=1.0)).top_p == 1.0


@pytest.mark.parametrize(
    "message, field",
    [
        (pb.SamplingParams(temperature=float("nan")), "temperature"),
        (pb.SamplingParams(temperature=1e-40), "temperature"),
        (pb.SamplingParams(temperature=1.0, top_p=float("nan")), "top_p"),
        (pb.SamplingParams(temperature=1.0, top_p=-0.5), "top_p"),
        (pb.SamplingParams(temperature=float("inf")), "temperature"),
        (pb.SamplingParams(top_k=-3), "top_k"),
    ],
)
def test_bad_sampling_on_the_wire_is_refused_by_field(message, field):
    with pytest.raises(ValueError, match=field):
        sampling_from_proto(message)


def test_finish_names():
    assert finish_name(pb.FINISH_REASON_LENGTH) == "length"
    assert finish_name(pb.FINISH_REASON_UNSPECIFIED) == "unknown"
    assert finish_name(99) == "unknown"


def test_requests_carry_every_field():
    open_msg = open_request([5, 6], SamplingParams(temperature=0.5, seed=3), Mode.EXACT, "fp",
                            max_new_tokens=9, stop_token_ids=[0], first_round=4).open
    assert list(open_msg.prompt_ids) == [5, 6] and open_msg.mode == pb.VERIFY_MODE_EXACT
    assert open_msg.tokenizer_fingerprint == "fp" and open_msg.max_new_tokens == 9 and open_msg.first_round == 4
    assert open_msg.sampling.seed == 3 and list(open_msg.stop_token_ids) == [0]
    q = [SparseDist(np.array([7, 2], np.int32), np.array([0.75, 0.25]))]
    draft = draft_request(3, [7], q).draft
    assert draft.round == 3 and list(draft.token_ids) == [7]
    assert list(draft.q[0].token_ids) == [7, 2] and list(draft.q[0].probs) == [0.75, 0.25]
    assert not draft_request(3, [7]).draft.q
    gen = generate_request([1], SamplingParams(), "fp", max_new_tokens=5, stop_token_ids=[])
    assert list(gen.prompt_ids) == [1] and gen.max_new_tokens == 5 and gen.tokenizer_fingerprint == "fp"


def test_wire_bytes_adds_the_frame_header():
    message = pb.SessionRequest(draft=pb.Draft(round=1, token_ids=[1, 2, 3]))
    assert wire_bytes(message) == message.ByteSize() + GRPC_FRAME_HEADER


def test_server_info_names_the_modes_and_keeps_unknown_numbers():
    reply = pb.InfoResponse(model_id="m", tokenizer_fingerprint="fp", vocab_size=10, max_context=64, max_k=8,
                            modes=[pb.VERIFY_MODE_GREEDY, pb.VERIFY_MODE_TOKEN, 42], max_new_tokens=5, version="v")
    info = server_info(reply)
    assert info.modes == ("greedy", "token", "42") and info.max_k == 8 and info.max_context == 64
