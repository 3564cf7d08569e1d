"""The Session over WebSocket, for browsers and React Native (docs/protocol.md, "WebSocket transport").

Neither speaks gRPC over HTTP/2, and gRPC-Web carries no bidirectional stream in a browser. So
the replica also serves the same Session messages as binary WebSocket frames, behind Serve's
HTTP ingress (the deployment is a Serve ASGI ingress as well as the gRPC servicer: ``app.py``).
A connection is one ASGI call on one replica for its whole life, as a gRPC stream is, so the
replica's KV cache stays valid without sticky routing.

    ws(s)://HOST:HTTP_PORT/<route prefix>/v1/session    one session; subprotocol edgespec.v1
    ws(s)://HOST:HTTP_PORT/<route prefix>/v1/generate   one cloud-only Generate call
    GET /v1/info                                        InfoResponse, binary protobuf

Everything after the handshake is the gRPC path's own code: ``VerifierDeployment.session`` (or
``generate``) reads the frames as its request stream (one frame = one SessionRequest, or the one
GenerateRequest, parsed by the same lenient, size-capped deserializer), with the same keys,
deadlines and refusals, and each reply is one frame. A refusal closes the connection with code
4000 + its gRPC status code and the status details as the reason; a normal end (Closed sent, the
last token sent, or the client's own close) closes with 1000.

Credentials: ``Sec-WebSocket-Protocol: edgespec.v1, edgespec.auth.<key or token>`` (all a
browser can set on a WebSocket), or ``authorization: Bearer <...>`` / ``x-api-key`` headers.
A browser's ``Origin`` must be in ``allowed_origins`` (config.py); a foreign one is closed 4007
before any work. A frame over the message cap is refused 4008; one over the HTTP server's own
WebSocket limit (uvicorn's 16 MiB, set by Serve) is closed 1009 by that server before it arrives.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Sequence

import grpc
from starlette.websockets import WebSocketDisconnect

from edgespec.cloud.serving.servicers import Malformed, lenient
from edgespec.edge.errors import ServerError, status_error
from edgespec.v1 import speculative_pb2 as pb

SESSION_PATH = "/v1/session"
GENERATE_PATH = "/v1/generate"
INFO_PATH = "/v1/info"
SUBPROTOCOL = "edgespec.v1"
AUTH_SUBPROTOCOL = "edgespec.auth."  # followed by the key or token
CLOSE_CODE_BASE = 4000  # a refusal closes with 4000 + its gRPC status code
NORMAL_CLOSE = 1000
MAX_REASON_BYTES = 123  # RFC 6455: a close frame's payload is at most 125 bytes, 2 of them the code
PROTOBUF = "application/x-protobuf"
# /v1/info's refusals as HTTP statuses (the gRPC status code rides along in ``grpc-status``).
HTTP_STATUSES = {grpc.StatusCode.UNAUTHENTICATED: HTTPStatus.UNAUTHORIZED, grpc.StatusCode.PERMISSION_DENIED: HTTPStatus.FORBIDDEN,
                 grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST}

Authenticate = Callable[..., Any]  # the deployment's (caller, *, required=True) -> ApiKey | None


def close_code(code: grpc.StatusCode) -> int:
    """The close code a refusal with gRPC status ``code`` ends a connection with."""
    return CLOSE_CODE_BASE + code.value[0]


def close_reason(details: str) -> str:
    """``details`` cut to the 123 bytes of UTF-8 a close frame holds, never inside a character."""
    return details.encode("utf-8")[:MAX_REASON_BYTES].decode("utf-8", errors="ignore")


def origin_allowed(origin: str | None, allowed: Sequence[str]) -> bool:
    """Whether a request from ``origin`` may go on: no Origin (not a browser) always may; a
    browser's only when ``allowed`` lists it or holds ``*``."""
    if origin is None:
        return True
    return "*" in allowed or origin.lower().rstrip("/") in allowed


def foreign_origin(origin: str) -> ServerError:
    return status_error(grpc.StatusCode.PERMISSION_DENIED, (
        f"origin {origin} is not allowed: the verifier's operator adds it to allowed_origins"))


class Caller:
    """The caller of an HTTP request or WebSocket upgrade, as the gRPC path sees one (``peer()``,
    ``invocation_metadata()``): the deployment authenticates both transports with one function."""

    def __init__(self, scope: dict):
        self.scope = scope
        self.headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", ())}

    @property
    def origin(self) -> str | None:
        return self.headers.get("origin")

    def peer(self) -> str:
        host, port = self.scope.get("client") or ("", 0)
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}" if host else ""

    def invocation_metadata(self) -> list[tuple[str, str]]:
        """The credential headers, and a subprotocol's credential as a bearer token; the Origin,
        which a token bound to an origin is checked against (auth.py)."""
        metadata = [(name, self.headers[name]) for name in ("authorization", "x-api-key", "origin") if name in self.headers]
        for offered in self.subprotocols:
            if offered.startswith(AUTH_SUBPROTOCOL):
                metadata.insert(0, ("authorization", "Bearer " + offered[len(AUTH_SUBPROTOCOL):]))
        return metadata

    @property
    def subprotocols(self) -> list[str]:
        return list(self.scope.get("subprotocols") or ())


async def requests_of(websocket, message_class=pb.SessionRequest) -> AsyncIterator[Any]:
    """The connection's frames as a request stream: each binary frame parsed as one message
    (``Malformed`` when it is not one, or over the cap); a text frame is Malformed."""
    parse, name = lenient(message_class), message_class.DESCRIPTOR.name
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("bytes")
        if data is None:
            yield Malformed(message_class.DESCRIPTOR.full_name, f"a text frame; send each {name} as one binary frame")
        else:
            yield parse(data)


Stream = Callable[..., AsyncGenerator[Any, None]]  # the deployment's session or generate: (requests, authenticate)


async def serve_stream(websocket, stream: Stream, message_class, authenticate: Authenticate, allowed_origins: Sequence[str]) -> None:
    """One WebSocket connection: the handshake, then ``stream`` (the deployment's) over its frames."""
    caller = Caller(websocket.scope)
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in caller.subprotocols else None)
    replies = None
    try:
        if not origin_allowed(caller.origin, allowed_origins):
            raise foreign_origin(str(caller.origin))
        replies = stream(requests_of(websocket, message_class), lambda: authenticate(caller))
        async for reply in replies:
            await websocket.send_bytes(reply.SerializeToString())
    except ServerError as exc:
        await _close(websocket, close_code(exc.code), close_reason(exc.details))
        return
    except (WebSocketDisconnect, OSError):
        return  # the client went away while a reply was on its way (the session was released)
    finally:
        if replies is not None:
            await replies.aclose()
    await _close(websocket, NORMAL_CLOSE, "")


async def _close(websocket, code: int, reason: str) -> None:
    """Closes the connection unless the client already did (then there is no one to tell)."""
    try:
        await websocket.close(code=code, reason=reason)
    except (RuntimeError, OSError):
        pass


async def serve_info(request, info: Callable[[Any], pb.InfoResponse], authenticate: Authenticate,
                     allowed_origins: Sequence[str]):
    """``GET /v1/info``: the InfoResponse as binary protobuf, behind the Origin and key checks of
    the session route (a key is optional: without one, no replica diagnostics, as over gRPC).
    Answers a browser's CORS preflight for the credential headers."""
    from starlette.responses import PlainTextResponse, Response

    caller = Caller(request.scope)
    cors = {"access-control-allow-origin": caller.origin, "access-control-expose-headers": "grpc-status",
            "vary": "Origin"} if caller.origin else {}
    try:
        if not origin_allowed(caller.origin, allowed_origins):
            cors = {}
            raise foreign_origin(str(caller.origin))
        if request.method == "OPTIONS":
            return Response(status_code=HTTPStatus.NO_CONTENT, headers={
                **cors, "access-control-allow-methods": "GET", "access-control-allow-headers": "authorization, x-api-key",
                "access-control-max-age": "600"})
        key = authenticate(caller, required=False)
    except ServerError as exc:
        status = HTTP_STATUSES.get(exc.code, HTTPStatus.BAD_REQUEST)
        return PlainTextResponse(exc.details, status_code=status, headers={**cors, "grpc-status": str(exc.code.value[0])})
    return Response(info(key).SerializeToString(), media_type=PROTOBUF, headers=cors)


def build_asgi_app(*, session: Stream, generate: Stream, info: Callable[[Any], pb.InfoResponse], authenticate: Authenticate,
                   allowed_origins: Sequence[str]):
    """The replica's HTTP routes (Serve's ASGI ingress): the session and generate sockets, and Info."""
    from starlette.applications import Starlette
    from starlette.routing import Route, WebSocketRoute

    async def session_route(websocket) -> None:
        await serve_stream(websocket, session, pb.SessionRequest, authenticate, allowed_origins)

    async def generate_route(websocket) -> None:
        await serve_stream(websocket, generate, pb.GenerateRequest, authenticate, allowed_origins)

    async def info_route(request):
        return await serve_info(request, info, authenticate, allowed_origins)

    return Starlette(routes=[WebSocketRoute(SESSION_PATH, session_route), WebSocketRoute(GENERATE_PATH, generate_route),
                             Route(INFO_PATH, info_route, methods=["GET", "OPTIONS"])])
