"""The registrations: bytes that are not a message, or too many, reach the handler as Malformed."""

from __future__ import annotations

import pytest

from edgespec.cloud.serving import servicers
from edgespec.cloud.serving.servicers import Malformed, lenient
from edgespec.v1 import speculative_pb2 as pb


@pytest.fixture(autouse=True)
def cap():
    servicers.set_message_cap(64)
    yield
    servicers.set_message_cap(servicers.DEFAULT_MESSAGE_CAP)


def test_a_valid_message_is_parsed():
    message = pb.SessionRequest(draft=pb.Draft(round=2, token_ids=[1, 2]))
    assert lenient(pb.SessionRequest)(message.SerializeToString()) == message


def test_garbage_and_oversize_become_malformed_before_parsing():
    parse = lenient(pb.SessionRequest)
    bad = parse(b"\x0a\xff")
    assert isinstance(bad, Malformed) and not bad.too_large and "not a valid edgespec.v1.SessionRequest" in bad.reason
    big = parse(b"\x00" * 65)
    assert isinstance(big, Malformed) and big.too_large and "limit of 64" in big.reason


class Recorder:
    def __init__(self):
        self.services = {}

    def add_generic_rpc_handlers(self, handlers):
        for handler in handlers:
            self.services[handler.service_name()] = set(handler._method_handlers)


class Placeholder:
    def __getattr__(self, name):
        return lambda *args: None


def test_every_service_is_registered_with_its_methods():
    server = Recorder()
    for fn in (servicers.add_speculative, servicers.add_health, servicers.add_reflection):
        fn(Placeholder(), server)
    assert server.services == {
        "edgespec.v1.Speculative": {"/edgespec.v1.Speculative/Session", "/edgespec.v1.Speculative/Generate",
                                    "/edgespec.v1.Speculative/Info"},
        "grpc.health.v1.Health": {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/List",
                                  "/grpc.health.v1.Health/Watch"},
        "grpc.reflection.v1.ServerReflection": {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"},
        "grpc.reflection.v1alpha.ServerReflection": {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"},
    }
