"""Admission: whether the replica takes one more session, counted in sessions, KV bytes and keys.

A session holds one of ``max_sessions`` slots and reserves, at Open, the KV cache its whole
generation may need: (prompt + max_new_tokens, at most the max context, + the most new tokens
one round feeds) rounded up to whole pages of the KV pool (``kv_pool.py``) x KV bytes per
token. The budget is the pool's size, so an admitted session never finds the pool empty.
The replica refuses (RESOURCE_EXHAUSTED) a session that would pass either budget, and one over
its API key's quota (``auth.Quotas``), before any model work. Everything taken is given back by
``release``, whatever way the session ends.

Before its Open, a stream is pending (``PendingOpens``): a silent stream holds nothing of the
above, only one of ``max_pending_streams`` places (at most ``max_pending_streams_per_key`` of
them per API key) until its Open arrives or ``first_message_timeout_s`` ends it. Serve's own
request slots are sized for sessions plus pending streams (``config.max_ongoing_requests``), so
the verifier, not Serve's queue, decides: a key's stream too many is refused at once, the
replica's oldest waiting stream is shed for a new one, and a silent crowd never delays another
device's Open or a session's verdicts.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Protocol

import grpc

from edgespec.cloud.serving.auth import ApiKey, Quotas
from edgespec.cloud.serving.session import SessionState
from edgespec.edge.errors import status_error


class Admission:
    def __init__(self, *, max_sessions: int, max_kv_bytes: int, kv_bytes_per_token: int, page_tokens: int = 1,
                 round_tokens: int = 0):
        self.max_sessions, self.max_kv_bytes, self.kv_bytes_per_token = max_sessions, max_kv_bytes, kv_bytes_per_token
        self.page_tokens, self.round_tokens = page_tokens, round_tokens
        self.active = 0
        self.reserved_bytes = 0
        self.quotas = Quotas()

    def reservation(self, state: SessionState) -> int:
        tokens = min(len(state.committed) + state.max_new_tokens, state.limits.max_context) + self.round_tokens
        pages = -(-tokens // self.page_tokens)
        return pages * self.page_tokens * self.kv_bytes_per_token

    def acquire(self, state: SessionState, key: ApiKey | None) -> None:
        """Takes a slot, the session's KV reservation and its key's share; raises RESOURCE_EXHAUSTED."""
        if self.active >= self.max_sessions:
            raise status_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"replica at capacity ({self.max_sessions} sessions): retry later or add replicas (retry after 1s)",
            )
        need = max(self.reservation(state), 1)
        # max_kv_bytes 0: the backend pins no KV per session (vLLM's cache evicts and recomputes)
        if self.max_kv_bytes and self.reserved_bytes + need > self.max_kv_bytes:
            raise status_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"replica KV cache budget full: this session needs {need} bytes, {self.max_kv_bytes - self.reserved_bytes} "
                f"of {self.max_kv_bytes} are free; lower max_new_tokens or retry later (retry after 1s)",
            )
        self.quotas.acquire(key)
        self.active += 1
        self.reserved_bytes += need
        state.reserved_bytes, state.key = need, key

    def release(self, state: SessionState) -> None:
        if state.reserved_bytes:
            self.active -= 1
            self.reserved_bytes -= state.reserved_bytes
            self.quotas.release(state.key)
            state.reserved_bytes = 0

    @property
    def free_sessions(self) -> int:
        return max(self.max_sessions - self.active, 0)



class Deadline(Protocol):
    """What a place needs of its timeout: ``asyncio.Timeout`` (Python 3.11+), named by what it
    does so this module type-checks on 3.10 as well."""

    def reschedule(self, when: float | None) -> None: ...


@dataclass(eq=False)
class PendingPlace:
    """One stream's place while it waits for its first message; ``deadline`` is the timeout
    the stream waits under, which shedding moves to now."""

    key_id: str | None
    deadline: Deadline | None = None
    shed: bool = False

    def shed_now(self) -> None:
        self.shed = True
        if self.deadline is not None:
            try:
                self.deadline.reschedule(asyncio.get_running_loop().time())
            except RuntimeError:  # its wait has just ended: nothing to cut short
                pass


class PendingOpens:
    """Streams started and waiting for their Open, bounded per API key and per replica.

    ``waiting(key)`` holds a place for the time the stream's first message takes. Past the
    key's bound the new stream is refused RESOURCE_EXHAUSTED before anything is read (one key's
    silent streams are its own problem). Past the replica's bound the OLDEST waiting stream is
    shed (its wait ends at once, ``PendingPlace.shed``): a device sends its Open within a round
    trip of starting its stream, so a crowd of silent streams, from any number of keys or from
    none (behind an ingress every stream has the same peer address), cannot keep a new device
    out; it would have to start more than ``max_streams`` streams within that round trip.
    """

    def __init__(self, *, max_streams: int, max_per_key: int):
        if max_streams < 1 or max_per_key < 1:
            raise ValueError(f"max_pending_streams ({max_streams}) and max_pending_streams_per_key ({max_per_key}) must be >= 1")
        self.max_streams, self.max_per_key = max_streams, max_per_key
        self.refused = 0  # streams refused over their key's bound
        self.shed = 0  # waiting streams shed for newer ones over the replica's bound
        self._places: dict[PendingPlace, None] = {}  # oldest first
        self._per_key: dict[str, int] = {}

    @property
    def count(self) -> int:
        return len(self._places)

    @contextmanager
    def waiting(self, key: ApiKey | None) -> Iterator[PendingPlace]:
        place = self._take(key)
        try:
            yield place
        finally:
            self._drop(place)

    def _take(self, key: ApiKey | None) -> PendingPlace:
        key_id = key.key_id if key is not None else None
        if key_id is not None and self._per_key.get(key_id, 0) >= self.max_per_key:
            self.refused += 1
            raise status_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"key {key_id!r} has {self.max_per_key} streams waiting for their Open on this replica, its limit "
                f"(max_pending_streams_per_key): {SEND_OPEN_AT_ONCE}",
            )
        if len(self._places) >= self.max_streams:
            oldest = next(iter(self._places))
            self._drop(oldest)
            oldest.shed_now()
            self.shed += 1
        place = PendingPlace(key_id)
        self._places[place] = None
        if key_id is not None:
            self._per_key[key_id] = self._per_key.get(key_id, 0) + 1
        return place

    def _drop(self, place: PendingPlace) -> None:
        if self._places.pop(place, False) is False:
            return  # shed already
        if place.key_id is not None:
            self._per_key[place.key_id] -= 1
            if not self._per_key[place.key_id]:
                del self._per_key[place.key_id]


SEND_OPEN_AT_ONCE = "a device sends its Open as the stream's first message, at once; retry after 1s"


def shed_error(max_streams: int) -> Exception:
    """The status of a waiting stream shed for a newer one (``PendingOpens``)."""
    return status_error(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"stream shed: it sent no Open while {max_streams} newer streams waited for theirs on this replica "
        f"(max_pending_streams): {SEND_OPEN_AT_ONCE}",
    )
