"""Knowing that Serve is stopping this replica, so its sessions can move before it goes.

Serve stops a replica (a scale-down, a redeploy, ``serve shutdown``) by starting its graceful
shutdown: the replica stays up while its ongoing requests finish, for up to
``graceful_shutdown_timeout_s``, and is then killed. A Session stream is an ongoing request
that lasts as long as its generation, so without help it either holds the replica up for the
whole timeout or is cut when the kill comes (and its device resumes after a backoff, having
waited for nothing).

Serve gives the user class no hook for the start of that shutdown (``__del__`` runs after the
drain), but the replica marks itself (``_shutting_down``, the flag its own data-plane health
check answers ``DRAINING`` from, which takes it out of HAProxy). ``DrainWatch`` reads that flag:
the deployment then answers each session's next verdict with ``draining`` set and ends the
stream with UNAVAILABLE, and refuses new sessions with UNAVAILABLE, so that every device
reopens at once, with its committed tokens, on a replica that stays. Reading a private flag
is tied to the Ray version (2.60, pinned in pyproject); where it cannot be found, a replica
behaves as before and its sessions resume when the stream breaks.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeGuard

import grpc

from edgespec.edge.errors import DRAINING_MESSAGE, ServerError, status_error

log = logging.getLogger("ray.serve")


def serve_replica_stopping() -> bool | None:
    """Whether Serve has begun stopping the replica this code runs in (None: not in a replica,
    or this Ray version does not say)."""
    try:
        from ray._private import worker as ray_worker

        worker = ray_worker.global_worker
        actor = worker.actors.get(worker.actor_id)
    except Exception:
        return None
    replica = getattr(actor, "_replica_impl", None)
    flag = getattr(replica, "_shutting_down", None)
    return flag if isinstance(flag, bool) else None


def draining_error() -> ServerError:
    """The UNAVAILABLE that ends a moved session's stream, or refuses an Open while draining."""
    error = status_error(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
    error.draining = True
    return error


def is_draining_error(exc: BaseException) -> TypeGuard[ServerError]:
    """Whether ``exc`` is ``draining_error()``'s kind (only a ServerError is ever marked draining)."""
    return isinstance(exc, ServerError) and exc.draining is True


class DrainWatch:
    """``draining`` is True from the moment Serve starts stopping this replica (it never turns
    back: a stopping replica is not revived). ``probe`` is injectable for tests."""

    def __init__(self, probe: Callable[[], bool | None] = serve_replica_stopping):
        self._probe = probe
        self.since: float | None = None

    @property
    def draining(self) -> bool:
        if self.since is None and self._probe():
            self.since = time.monotonic()
            log.info("edgespec: Serve is stopping this replica; its sessions are told to move to another replica")
        return self.since is not None
