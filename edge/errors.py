"""edgespec's typed errors: one hierarchy for the device, the verifier and the tooling.

    EdgespecError
    ├── ConnectionFailedError     the server could not be reached (after retries)
    ├── RequestTimeoutError       no reply within the timeout (after retries)
    ├── TokenizerMismatchError    draft and target tokenize differently (also a ValueError)
    └── ServerError               a gRPC status: what the server answered (SDK), or what it
        │                         answers (the verifier raises these to refuse a request)
        ├── InvalidRequestError       INVALID_ARGUMENT / OUT_OF_RANGE: fix the request
        ├── SessionStateError         FAILED_PRECONDITION: protocol misuse
        ├── AuthenticationError       UNAUTHENTICATED / PERMISSION_DENIED: send a valid API key
        ├── CapacityError             RESOURCE_EXHAUSTED: retry later / add replicas
        └── InternalServerError       INTERNAL / UNKNOWN / anything else

Tooling adds its own leaves (``ExportError`` in ``edgespec.cloud.training.export``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from edgespec.edge.types import Result


class EdgespecError(Exception):
    """Base class of every error the SDK raises.

    ``partial``: when a generation fails midway, the Result of what was committed before
    the error (its ``finish_reason`` is "error"); None otherwise.
    """

    partial: Result | None = None


class ConnectionFailedError(EdgespecError):
    pass


class RequestTimeoutError(EdgespecError):
    pass


class TokenizerMismatchError(EdgespecError, ValueError):
    def __init__(self, draft_fingerprint: str, server_fingerprint: str, message: str | None = None):
        super().__init__(
            message
            or f"tokenizer mismatch: the draft's tokenizer is {draft_fingerprint!r} but the server's "
            f"target uses {server_fingerprint!r}; export the draft with the target's tokenizer"
        )
        self.draft_fingerprint = draft_fingerprint
        self.server_fingerprint = server_fingerprint


class DraftIntegrityError(EdgespecError, ValueError):
    """A draft's graph (or its external data) is not the file its manifest was written for:
    corrupted, tampered with, or from another export. Re-export or re-download the draft."""


class ServerError(EdgespecError):
    draining: bool = False  # a stopping replica's UNAVAILABLE (cloud/serving/drain.py sets it)

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class InvalidRequestError(ServerError):
    pass


class SessionStateError(ServerError):
    pass


class CapacityError(ServerError):
    pass


class AuthenticationError(ServerError):
    pass


class InternalServerError(ServerError):
    pass


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRequestError,
    grpc.StatusCode.FAILED_PRECONDITION: SessionStateError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: CapacityError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: AuthenticationError,
}

# What a replica that Serve is stopping (scale-down, redeploy) answers with UNAVAILABLE: the
# verdict before it said ``draining``, or a new Open reached it before the ingress took it out.
DRAINING_MESSAGE = (
    "this replica is shutting down (scale-down or redeploy): open a new session with every committed token; "
    "another replica takes it"
)
# An Open refused for that reason is tried again after about this long (the ingress takes the
# replica out within its health-check interval).
DRAINING_RETRY_S = 0.1
# ... for at most this long (Serve's graceful shutdown of a replica lasts about as long).
DRAINING_PATIENCE_S = 30.0

# Worth a new attempt (a new session resumed from the committed tokens): the stream or the
# replica went away, or the server was momentarily full.
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
    }
)


def status_error(code: grpc.StatusCode, details: str) -> ServerError:
    """The ServerError subclass for a status code (the verifier refuses requests with these)."""
    return _BY_CODE.get(code, InternalServerError)(code, details)


# What grpc's core sets on a call whose send failed on this side (the connection broke under the
# write: grpc.aio gives the call this INTERNAL status). No server said it: the link went away.
LOCAL_SEND_FAILURE = "Internal error from Core"


def from_rpc_error(error: grpc.RpcError) -> EdgespecError:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else "") or str(error)
    if code == grpc.StatusCode.UNAVAILABLE:
        return ConnectionFailedError(f"server unavailable: {details}")
    if code == grpc.StatusCode.INTERNAL and details == LOCAL_SEND_FAILURE:
        return ConnectionFailedError(f"the connection broke while sending (grpc: {LOCAL_SEND_FAILURE})")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimeoutError(f"request timed out: {details}")
    return status_error(code, details)


def is_retryable(error: BaseException) -> bool:
    # NOTE: asyncio.wait_for's asyncio.TimeoutError is a TimeoutError only from Python 3.11.
    if isinstance(error, (TimeoutError, asyncio.TimeoutError, ConnectionError)):
        return True
    return isinstance(error, grpc.RpcError) and error.code() in RETRYABLE_CODES
