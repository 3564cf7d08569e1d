"""The client conformance kit (scripted_verifier.py) against the Python SDK: every scenario,
and the kit's own judgement on a client that breaks the contract."""

from __future__ import annotations

import grpc
import pytest
from conformance.scripted_verifier import SCENARIOS, check, client_request, run_sdk, serve

from edgespec.v1 import speculative_pb2 as pb
from edgespec.v1 import speculative_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def sdk_failures(tiny_pair):
    return run_sdk(str(tiny_pair.draft_dir))


@pytest.mark.parametrize("scenario", [s.name for s in SCENARIOS])
def test_the_python_sdk_passes(sdk_failures, scenario):
    assert sdk_failures[scenario] == []


def test_the_scenarios_cover_the_contract():
    names = {s.name for s in SCENARIOS}
    assert {"all_accepted", "reject_at_2", "budget_edge", "stop_token", "discarded_ahead", "drain_reopen",
            "resume_after_cut"} <= names
    assert {s.refuse for s in SCENARIOS if s.refuse} >= {"INVALID_ARGUMENT", "OUT_OF_RANGE", "FAILED_PRECONDITION",
                                                          "UNAUTHENTICATED", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "UNAVAILABLE"}


def _open(scenario, **changes) -> pb.SessionRequest:
    fields = dict(prompt_ids=scenario.prompt, mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint="fp",
                  max_new_tokens=scenario.max_new_tokens, stop_token_ids=[63], first_round=0)
    fields.update(changes)
    return pb.SessionRequest(open=pb.Open(**fields))


def test_the_kit_catches_a_client_that_does_not_resume_from_its_committed_tokens():
    server, verifier, port = serve("fp", 64)
    scenario = next(s for s in SCENARIOS if s.name == "resume_after_cut")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.SpeculativeStub(channel)
            drafts = [pb.SessionRequest(draft=pb.Draft(round=r, token_ids=[1, 2, 3])) for r in range(3)]
            with pytest.raises(grpc.RpcError):  # cut after two verdicts
                list(stub.Session(iter([_open(scenario), *drafts]), timeout=10))
            # A broken client: reopens with the prompt only, from round 0.
            replies = list(stub.Session(iter([_open(scenario), pb.SessionRequest(close=pb.Close())]), timeout=10))
            assert replies[0].HasField("opened")
    finally:
        server.stop(grace=None)
    record = verifier.report()[scenario.name]
    assert any("prompt_ids must be the prompt and every committed token" in v for v in record["violations"])
    assert any("first_round 0, the next round is 2" in v for v in record["violations"])
    assert check(scenario, record, {"token_ids": record["committed"], "finish_reason": ""})


def test_the_kit_catches_a_wrong_round_and_a_retried_refusal():
    server, verifier, port = serve("fp", 64)
    wrong_round = SCENARIOS[0]
    refused = next(s for s in SCENARIOS if s.refuse == "INVALID_ARGUMENT")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.SpeculativeStub(channel)
            with pytest.raises(grpc.RpcError) as error:
                list(stub.Session(iter([_open(wrong_round), pb.SessionRequest(draft=pb.Draft(round=5, token_ids=[1]))]), timeout=10))
            assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(grpc.RpcError):
                list(stub.Session(iter([_open(refused)]), timeout=10))
            list(stub.Session(iter([_open(refused)]), timeout=10))  # a broken client tries again
    finally:
        server.stop(grace=None)
    report = verifier.report()
    assert "Draft for round 5, expected round 0" in report[wrong_round.name]["violations"]
    assert any("not to retry" in v for v in report[refused.name]["violations"])


def test_every_scenario_is_a_request_any_client_can_make():
    for scenario in SCENARIOS:
        request = client_request(scenario, 64)
        assert request["prompt_ids"][0] == scenario.number and request["stop_token_ids"] == [63]
