"""Bad input gets a precise gRPC status and a message, and never disturbs other sessions.

A healthy client generates in a loop in the background for the whole module; the last test
checks that every one of its outputs equals the target's own greedy output.
"""

from __future__ import annotations


import grpc
import pytest
from helpers import start_server, stop_server
from helpers.raw import Session, check_healthy_device, healthy_device, open_msg

from edgespec.v1 import speculative_pb2 as pb
from edgespec.v1 import speculative_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

MAX_SESSIONS = 6
IDLE_TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def server(tiny_pair):
    srv = start_server(
        tiny_pair,
        max_sessions=MAX_SESSIONS,
        max_new_tokens=256,
        max_context=128,
        max_k=8,
        session_idle_timeout_s=IDLE_TIMEOUT_S,
        engine_process=True,  # this module covers the child-process engine; the others run inline
    )
    yield srv
    stop_server()


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.address)
    yield pb_grpc.SpeculativeStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def info(stub):
    return stub.Info(pb.InfoRequest(), timeout=30)


@pytest.fixture(scope="module")
def healthy(server, target_model):
    """Generates continuously on another thread while the bad inputs arrive."""
    yield healthy_device(server)


def expect_status(session: Session, code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        session.reply()
    assert caught.value.code() == code, caught.value.details()
    details = caught.value.details()
    for fragment in fragments:
        assert fragment in details, details
    return details


def opened_session(stub, info, **overrides) -> Session:
    session = Session(stub)
    session.send(open=open_msg(info, **overrides))
    assert session.reply().HasField("opened")
    return session


def exact_q(token: int, probs: dict[int, float]) -> pb.SparseDistribution:
    return pb.SparseDistribution(token_ids=list(probs), probs=list(probs.values()))


OPEN_CASES = {
    "prompt token outside vocabulary": (dict(prompt_ids=[5, 10**6]), grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
    "negative prompt token": (dict(prompt_ids=[-1]), grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
    "empty prompt": (dict(prompt_ids=[]), grpc.StatusCode.INVALID_ARGUMENT, "prompt_ids is empty"),
    "unknown mode": (dict(mode=7), grpc.StatusCode.INVALID_ARGUMENT, "unknown verification mode 7"),
    "unspecified mode": (dict(mode=0), grpc.StatusCode.INVALID_ARGUMENT, "unknown verification mode 0"),
    "tokenizer mismatch": (dict(tokenizer_fingerprint="bpe-512-deadbeef"), grpc.StatusCode.FAILED_PRECONDITION, "bpe-512-deadbeef"),
    "missing fingerprint": (dict(tokenizer_fingerprint=""), grpc.StatusCode.INVALID_ARGUMENT, "tokenizer_fingerprint"),
    "prompt longer than max context": (dict(prompt_ids=[5] * 200), grpc.StatusCode.INVALID_ARGUMENT, "max context of 128"),
    "max_new_tokens over the limit": (dict(max_new_tokens=100_000), grpc.StatusCode.OUT_OF_RANGE, "limit of 256"),
    "sampling mode at temperature 0": (dict(mode=pb.VERIFY_MODE_EXACT), grpc.StatusCode.INVALID_ARGUMENT, "temperature > 0"),
    "negative temperature": (
        dict(mode=pb.VERIFY_MODE_EXACT, sampling=pb.SamplingParams(temperature=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "temperature",
    ),
}


@pytest.mark.parametrize("case", list(OPEN_CASES))
def test_bad_open(stub, info, healthy, case):
    overrides, code, fragment = OPEN_CASES[case]
    session = Session(stub)
    session.send(open=open_msg(info, **overrides))
    expect_status(session, code, fragment)
    session.close()


def draft_cases(info):
    v = info.vocab_size
    return {
        "draft token outside vocabulary": (dict(), pb.Draft(round=0, token_ids=[v]), grpc.StatusCode.INVALID_ARGUMENT, "outside"),
        "k = 0": (dict(), pb.Draft(round=0, token_ids=[]), grpc.StatusCode.INVALID_ARGUMENT, "k = 0"),
        "k above max_k": (dict(), pb.Draft(round=0, token_ids=[1] * 9), grpc.StatusCode.INVALID_ARGUMENT, "max_k = 8"),
        "wrong round number": (dict(), pb.Draft(round=3, token_ids=[1]), grpc.StatusCode.FAILED_PRECONDITION, "expected round 0"),
        "q sent in greedy mode": (
            dict(),
            pb.Draft(round=0, token_ids=[1], q=[exact_q(1, {1: 1.0})]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "only sent in exact mode",
        ),
        "q with NaN": (
            dict(mode=pb.VERIFY_MODE_EXACT, sampling=pb.SamplingParams(temperature=1.0)),
            pb.Draft(round=0, token_ids=[1], q=[exact_q(1, {1: float("nan"), 2: 0.5})]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "finite",
        ),
        "q negative": (
            dict(mode=pb.VERIFY_MODE_EXACT, sampling=pb.SamplingParams(temperature=1.0)),
            pb.Draft(round=0, token_ids=[1], q=[exact_q(1, {1: 1.5, 2: -0.5})]),
            grpc.StatusCode.INVALID_ARGUMENT,
            ">= 0",
        ),
        "q sum far from 1": (
            dict(mode=pb.VERIFY_MODE_EXACT, sampling=pb.SamplingParams(temperature=1.0)),
            pb.Draft(round=0, token_ids=[1], q=[exact_q(1, {1: 0.2, 2: 0.2})]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "sums to 0.4",
        ),
        "drafted token has q = 0": (
            dict(mode=pb.VERIFY_MODE_EXACT, sampling=pb.SamplingParams(temperature=1.0)),
            pb.Draft(round=0, token_ids=[1], q=[exact_q(1, {1: 0.0, 2: 1.0})]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "probability 0",
        ),
        "q missing in exact mode": (
            dict(mode=pb.VERIFY_MODE_EXACT, sampling=pb.SamplingParams(temperature=1.0)),
            pb.Draft(round=0, token_ids=[1, 2]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "one draft distribution per drafted token",
        ),
        "drafts past the max context": (
            dict(prompt_ids=[5] * 125),
            pb.Draft(round=0, token_ids=[1] * 5),
            grpc.StatusCode.OUT_OF_RANGE,
            "max context of 128",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "draft token outside vocabulary",
        "k = 0",
        "k above max_k",
        "wrong round number",
        "q sent in greedy mode",
        "q with NaN",
        "q negative",
        "q sum far from 1",
        "drafted token has q = 0",
        "q missing in exact mode",
        "drafts past the max context",
    ],
)
def test_bad_draft(stub, info, healthy, case):
    open_overrides, draft, code, fragment = draft_cases(info)[case]
    session = opened_session(stub, info, **open_overrides)
    session.send(draft=draft)
    expect_status(session, code, fragment)
    session.close()


def test_draft_before_open(stub, healthy):
    session = Session(stub)
    session.send(draft=pb.Draft(round=0, token_ids=[1]))
    expect_status(session, grpc.StatusCode.FAILED_PRECONDITION, "Draft before Open")
    session.close()


def test_open_twice(stub, info, healthy):
    session = opened_session(stub, info)
    session.send(open=open_msg(info))
    expect_status(session, grpc.StatusCode.FAILED_PRECONDITION, "Open sent twice")
    session.close()


def test_draft_after_finish(stub, info, healthy):
    session = opened_session(stub, info, max_new_tokens=1)
    session.send(draft=pb.Draft(round=0, token_ids=[1, 2]))
    verdict = session.reply().verdict
    assert verdict.finished and verdict.finish_reason == pb.FINISH_REASON_LENGTH
    assert verdict.accepted == 0  # the budget of 1 token is the next token alone
    session.send(draft=pb.Draft(round=1, token_ids=[1]))
    expect_status(session, grpc.StatusCode.FAILED_PRECONDITION, "already finished")
    session.close()


def test_retried_round_gets_the_same_verdict(stub, info, healthy):
    session = opened_session(stub, info)
    session.send(draft=pb.Draft(round=0, token_ids=[1, 2, 3]))
    first = session.reply().verdict
    session.send(draft=pb.Draft(round=0, token_ids=[1, 2, 3]))
    assert session.reply().verdict == first
    session.close()


def test_bad_generate(stub):
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(pb.GenerateRequest(prompt_ids=[10**6]), timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside the vocabulary" in caught.value.details()


def test_idle_session_is_closed_with_deadline_exceeded(stub, info, healthy):
    session = opened_session(stub, info)
    expect_status(session, grpc.StatusCode.DEADLINE_EXCEEDED, "idle")
    session.close()


def test_capacity_is_refused_with_resource_exhausted(stub, info, healthy):
    # The healthy client holds one session; fill the rest, then one more is refused.
    held = []
    try:
        refused = None
        for _ in range(MAX_SESSIONS + 1):
            session = Session(stub)
            session.send(open=open_msg(info))
            try:
                assert session.reply().HasField("opened")
                held.append(session)
            except grpc.RpcError as exc:
                refused = exc
                break
        assert refused is not None and refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "capacity" in refused.details()
    finally:
        for session in held:
            session.close()


def test_health_service(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=30).status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_service(server):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(server.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30))
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"edgespec.v1.Speculative", "grpc.health.v1.Health"} <= names


def test_healthy_session_was_never_disturbed(healthy, target_model):
    check_healthy_device(healthy, target_model, min_results=2)
