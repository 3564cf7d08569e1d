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


# ---- the kit over WebSocket: a minimal client speaking the frames ------------------------------------

VOCAB = 64


def ws_connect(port: int, path: str):
    from websockets.sync.client import connect

    return connect(f"ws://127.0.0.1:{port}{path}", subprotocols=["edgespec.v1"], compression=None, proxy=None,  # type: ignore[list-item]
                   open_timeout=10)


def received(ws) -> bytes:
    data = ws.recv(timeout=10)
    assert isinstance(data, bytes), f"a text frame from the kit: {data!r}"
    return data


def ws_generation(port: int, scenario) -> dict:
    """One scenario as a client must play it over WebSocket: frames in, frames out; a close of
    4014 (UNAVAILABLE) reopens from every committed token, any other 40xx is the result's error."""
    from websockets.exceptions import ConnectionClosed

    committed: list[int] = []
    next_round = 0
    for _ in range(5):
        with ws_connect(port, "/v1/session" if scenario.rpc == "Session" else "/v1/generate") as ws:
            try:
                left = scenario.max_new_tokens - len(committed)
                if scenario.rpc == "Generate":
                    ws.send(pb.GenerateRequest(prompt_ids=scenario.prompt + committed, max_new_tokens=left, stop_token_ids=[VOCAB - 1],
                                               first_round=next_round, tokenizer_fingerprint="fp").SerializeToString())
                    while True:
                        reply = pb.GenerateResponse.FromString(received(ws))
                        committed += reply.token_ids
                        next_round += 1
                        if reply.finished:
                            return {"token_ids": committed, "finish_reason": {1: "stop_token", 2: "length"}[reply.finish_reason]}
                ws.send(_open(scenario, prompt_ids=scenario.prompt + committed, max_new_tokens=left,
                              first_round=next_round).SerializeToString())
                assert pb.SessionResponse.FromString(received(ws)).HasField("opened")
                while True:
                    drafts = [1, 2, 3, 4]
                    ws.send(pb.SessionRequest(draft=pb.Draft(round=next_round, token_ids=drafts)).SerializeToString())
                    verdict = pb.SessionResponse.FromString(received(ws)).verdict
                    committed += drafts[:verdict.accepted] + [verdict.next_token]
                    next_round += 1
                    if verdict.finished:
                        ws.send(pb.SessionRequest(close=pb.Close()).SerializeToString())
                        assert pb.SessionResponse.FromString(received(ws)).HasField("closed")
                        return {"token_ids": committed, "finish_reason": {1: "stop_token", 2: "length"}[verdict.finish_reason]}
            except ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd is not None else 1006
                if code != 4000 + grpc.StatusCode.UNAVAILABLE.value[0]:
                    return {"error": grpc.StatusCode(next(c for c in grpc.StatusCode if c.value[0] == code - 4000)).name}
    raise AssertionError("more than five streams for one scenario")


@pytest.mark.parametrize("name", ["all_accepted", "reject_at_2", "stop_token", "drain_reopen", "resume_after_cut", "cloud_only",
                                  "cloud_resume", "refuse_invalid_argument"])
def test_the_kit_plays_its_scenarios_over_websocket(name):
    server, verifier, port = serve("fp", VOCAB, transport="websocket")
    scenario = next(s for s in SCENARIOS if s.name == name)
    try:
        result = ws_generation(port, scenario)
    finally:
        server.stop(grace=None)
    assert check(scenario, verifier.report().get(scenario.name), result) == []
    assert ("error" in result) == (scenario.expect_error is not None)


def test_the_kit_over_websocket_answers_info_and_refuses_text_frames():
    import urllib.request

    from websockets.exceptions import ConnectionClosed

    server, _, port = serve("fp", VOCAB, transport="websocket")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/info", timeout=10) as response:
            assert response.headers["content-type"] == "application/x-protobuf"
            info = pb.InfoResponse.FromString(response.read())
        assert (info.tokenizer_fingerprint, info.vocab_size) == ("fp", VOCAB)
        with ws_connect(port, "/v1/session") as ws:
            assert ws.subprotocol == "edgespec.v1"
            ws.send("{}")
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4000 + grpc.StatusCode.INVALID_ARGUMENT.value[0]
    finally:
        server.stop(grace=None)
