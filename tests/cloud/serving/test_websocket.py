"""The WebSocket transport's pieces that need no server (websocket.py): close codes and reasons,
the Origin allow-list and its config, the caller's credentials as the gRPC path reads them, and
frames as the session's request stream. The route itself runs through Serve in
tests/e2e/test_websocket.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from edgespec.cloud.serving.config import checked_origins
from edgespec.cloud.serving.servicers import Malformed, message_cap
from edgespec.cloud.serving.websocket import Caller, close_code, close_reason, origin_allowed, requests_of
from edgespec.v1 import speculative_pb2 as pb


def test_a_refusal_closes_with_4000_plus_its_status_code():
    assert close_code(grpc.StatusCode.INVALID_ARGUMENT) == 4003
    assert close_code(grpc.StatusCode.UNAUTHENTICATED) == 4016
    assert close_code(grpc.StatusCode.UNAVAILABLE) == 4014


def test_the_reason_fits_a_close_frame_and_never_cuts_a_character():
    assert close_reason("short") == "short"
    cut = close_reason("é" * 100)  # 200 bytes of UTF-8
    assert len(cut.encode()) <= 123 and cut == "é" * 61


@pytest.mark.parametrize("origin, allowed, ok", [
    (None, (), True),  # not a browser
    ("https://app.example.com", (), False),
    ("https://app.example.com", ("https://app.example.com",), True),
    ("https://APP.example.com/", ("https://app.example.com",), True),
    ("https://evil.example.com", ("https://app.example.com",), False),
    ("null", ("*",), True),
])
def test_the_origin_allow_list(origin, allowed, ok):
    assert origin_allowed(origin, allowed) is ok


def test_allowed_origins_are_validated_by_name():
    assert checked_origins(["https://App.example.com", "*", "http://localhost:5173"]) == (
        "https://app.example.com", "*", "http://localhost:5173")
    for bad in (["https://app.example.com/"], ["app.example.com"], ["https://a.com/path"]):
        with pytest.raises(ValueError, match="allowed_origins"):
            checked_origins(bad)
    with pytest.raises(ValueError, match="list of origins"):
        checked_origins("https://app.example.com")


def test_the_caller_reads_as_a_grpc_context():
    scope = {"client": ("10.0.0.5", 5123), "subprotocols": ["edgespec.v1", "edgespec.auth.est1.abc.def"],
             "headers": [(b"origin", b"https://app.example.com"), (b"x-api-key", b"es-header")]}
    caller = Caller(scope)
    assert caller.peer() == "ipv4:10.0.0.5:5123" and caller.origin == "https://app.example.com"
    assert caller.invocation_metadata() == [("authorization", "Bearer est1.abc.def"), ("x-api-key", "es-header"),
                                            ("origin", "https://app.example.com")]
    assert Caller({"client": ("::1", 9)}).peer() == "ipv6:[::1]:9"


class FakeSocket:
    def __init__(self, messages):
        self.messages = list(messages)

    async def receive(self):
        return self.messages.pop(0)


def test_frames_are_the_sessions_requests():
    good = pb.SessionRequest(close=pb.Close()).SerializeToString()
    socket = FakeSocket([{"type": "websocket.receive", "bytes": good}, {"type": "websocket.receive", "text": "{}"},
                         {"type": "websocket.receive", "bytes": b"\xff\xff"},
                         {"type": "websocket.receive", "bytes": b"\x00" * (message_cap() + 1)},
                         {"type": "websocket.disconnect", "code": 1000}])

    async def read():
        return [message async for message in requests_of(socket)]

    got = asyncio.run(read())
    assert got[0] == pb.SessionRequest(close=pb.Close()) and len(got) == 4
    assert isinstance(got[1], Malformed) and "text frame" in got[1].reason
    assert isinstance(got[2], Malformed) and not got[2].too_large
    assert isinstance(got[3], Malformed) and got[3].too_large


def test_edgespec_serve_takes_allowed_origins_and_a_wss_port():
    import argparse

    from helpers import REPO

    from edgespec.cli import serve as serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args(["--model", str(REPO / "models" / "demo" / "target"), "--allowed-origins",
                              "https://App.example.com, http://localhost:5173", "--wss-port", "9443"])
    config = serve_cli.config_from_args(args)
    assert config.allowed_origins == ("https://app.example.com", "http://localhost:5173") and args.wss_port == 9443
    args = parser.parse_args(["--model", str(REPO / "models" / "demo" / "target"), "--allowed-origins", "app.example.com"])
    with pytest.raises(ValueError, match="allowed_origins"):
        serve_cli.config_from_args(args)
