"""The gRPC services Serve's ingress registers (``gRPCOptions.grpc_servicer_functions``).

Serve calls each function with a placeholder servicer and its gRPC server; a function registers
its service's methods with their (de)serializers, and Serve routes every call to the
deployment method of the same name. These differ from the generated ``add_*_to_server`` in one
way: a request is parsed by a *lenient* deserializer. Bytes that are not a valid message, or
more than the message cap, arrive at the handler as a ``Malformed`` value, which it refuses
INVALID_ARGUMENT (RESOURCE_EXHAUSTED for the size), instead of failing inside the transport
with a status the client cannot act on. The size is checked before anything is parsed.

Services: edgespec.v1.Speculative, grpc.health.v1.Health, and server reflection under both
grpc.reflection.v1 and grpc.reflection.v1alpha (the two are the same messages on the wire;
the deployment answers them itself, behind the API key, so Serve's own reflection is off).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from edgespec.v1 import speculative_pb2 as pb

DEFAULT_MESSAGE_CAP = 4 << 20  # bytes, until the deployment sets its own (``set_message_cap``)
_cap = [DEFAULT_MESSAGE_CAP]

REFLECTION_SERVICES = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")
SPECULATIVE_SERVICE = "edgespec.v1.Speculative"
HEALTH_SERVICE = "grpc.health.v1.Health"


@dataclass(frozen=True)
class Malformed:
    """What a lenient deserializer returns for bytes it refuses: the handler answers for it."""

    message_type: str
    reason: str
    too_large: bool = False


def set_message_cap(nbytes: int) -> None:
    """The largest request message accepted by this process's deserializers."""
    _cap[0] = int(nbytes)


def message_cap() -> int:
    return _cap[0]


def lenient(message_class):
    name = message_class.DESCRIPTOR.full_name

    def parse(data: bytes):
        if len(data) > _cap[0]:
            return Malformed(name, f"{len(data)} bytes, more than this server's limit of {_cap[0]}", too_large=True)
        try:
            return message_class.FromString(data)
        except (DecodeError, ValueError) as exc:
            return Malformed(name, f"not a valid {name}: {exc}")

    return parse


def _register(server, service: str, handlers: dict) -> None:
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    if hasattr(server, "add_registered_method_handlers"):
        server.add_registered_method_handlers(service, handlers)


def add_speculative(servicer, server) -> None:
    _register(server, SPECULATIVE_SERVICE, {
        "Session": grpc.stream_stream_rpc_method_handler(
            servicer.Session, request_deserializer=lenient(pb.SessionRequest),
            response_serializer=pb.SessionResponse.SerializeToString),
        "Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate, request_deserializer=lenient(pb.GenerateRequest),
            response_serializer=pb.GenerateResponse.SerializeToString),
        "Info": grpc.unary_unary_rpc_method_handler(
            servicer.Info, request_deserializer=lenient(pb.InfoRequest),
            response_serializer=pb.InfoResponse.SerializeToString),
    })


def add_health(servicer, server) -> None:
    _register(server, HEALTH_SERVICE, {
        "Check": grpc.unary_unary_rpc_method_handler(
            servicer.Check, request_deserializer=lenient(health_pb2.HealthCheckRequest),
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
        "List": grpc.unary_unary_rpc_method_handler(
            # the List messages are newer than grpcio-health-checking's type stubs
            servicer.List, request_deserializer=lenient(health_pb2.HealthListRequest),  # pyright: ignore[reportAttributeAccessIssue]
            response_serializer=health_pb2.HealthListResponse.SerializeToString),  # pyright: ignore[reportAttributeAccessIssue]
        "Watch": grpc.unary_stream_rpc_method_handler(
            servicer.Watch, request_deserializer=lenient(health_pb2.HealthCheckRequest),
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
    })


def add_reflection(servicer, server) -> None:
    for service in REFLECTION_SERVICES:
        _register(server, service, {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo, request_deserializer=lenient(reflection_pb2.ServerReflectionRequest),
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString),
        })


SERVICER_FUNCTIONS = [f"edgespec.cloud.serving.servicers.{name}" for name in ("add_speculative", "add_health", "add_reflection")]
