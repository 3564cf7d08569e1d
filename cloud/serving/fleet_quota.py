"""A key's tokens per minute across every replica: one shared count in a detached Ray actor.

Each replica's ``Quotas`` keeps its own sliding minute (the local guard: a key can never take
more than its ``tokens_per_minute`` on one replica, whatever happens to the shared count). With
a ``FleetQuota`` it also refuses a key whose tokens across the fleet reached that limit in the
last minute. The replica never waits on the store: charges collect locally and go to the actor
at most once per ``FLUSH_S`` (at a check, which comes before every round), and the answer (every reported key's fleet-wide use) is picked up
at a later check when it has arrived. The fleet count so lags by about a second (a key may pass
its limit by what the fleet generates in that second); if the store is unreachable the local
guard alone applies.

The store is a detached named actor (``edgespec_fleet_quota`` in namespace ``edgespec``),
created by the first replica that needs it and shared by every application in the cluster.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from collections import Counter, deque

log = logging.getLogger("ray.serve")

ACTOR_NAME = "edgespec_fleet_quota"
NAMESPACE = "edgespec"
WINDOW_S = 60.0
FLUSH_S = 1.0


class MinuteCounts:
    """Tokens per key over a sliding minute (the store's state; plain Python, tested alone)."""

    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._events: dict[str, deque] = {}

    def add(self, charges: dict[str, int], now: float) -> None:
        for key_id, tokens in charges.items():
            if tokens:
                self._events.setdefault(key_id, deque()).append((now, tokens))

    def used(self, key_id: str, now: float) -> int:
        events = self._events.get(key_id)
        if not events:
            return 0
        while events and events[0][0] < now - self.window_s:
            events.popleft()
        return sum(tokens for _, tokens in events)


class FleetQuotaStore:
    """The actor's class: ``report`` adds a replica's charges and answers the fleet's use."""

    def __init__(self) -> None:
        self.counts = MinuteCounts()

    def report(self, charges: dict[str, int], keys: list[str]) -> dict[str, int]:
        now = time.monotonic()
        self.counts.add(charges, now)
        return {key_id: self.counts.used(key_id, now) for key_id in set(keys) | set(charges)}


def store_actor() -> Any:
    """The shared store, created detached on first use (any replica may race to create it)."""
    import ray

    return ray.remote(FleetQuotaStore).options(num_cpus=0, max_concurrency=64, name=ACTOR_NAME, namespace=NAMESPACE,
                                               lifetime="detached", get_if_exists=True).remote()


class FleetQuota:
    """A replica's view of the fleet-wide count: charges sent in batches, answers read when ready."""

    def __init__(self, store=None, *, flush_s: float = FLUSH_S, clock=time.monotonic):
        self._store = store
        self._flush_s, self._clock = flush_s, clock
        self._pending: Counter = Counter()  # charged here, not yet reported
        self._in_flight: Counter = Counter()  # reported, answer not yet back
        self._known: dict[str, int] = {}  # fleet-wide use at the last answer
        self._reply = None
        self._last_flush = float("-inf")

    def charge(self, key_id: str, tokens: int) -> None:
        self._pending[key_id] += tokens

    def used(self, key_id: str) -> int:
        """Fleet-wide tokens of ``key_id`` in the last minute, as far as this replica knows."""
        self._poll(key_id)
        return self._known.get(key_id, 0) + self._in_flight[key_id] + self._pending[key_id]

    def _poll(self, key_id: str) -> None:
        if self._reply is not None:
            # NOTE: a future, not ray.wait/ray.get: the replica's event loop must never block on the store.
            if not self._reply.done():
                return
            try:
                self._known.update(self._reply.result())
            except Exception as exc:  # noqa: BLE001  the store gone: the local guard still holds
                log.warning("fleet quota store unreachable (%s): counting on this replica only until it answers", exc)
                self._store = None
            self._reply, self._in_flight = None, Counter()
        if self._clock() - self._last_flush < self._flush_s:
            return
        self._last_flush = self._clock()
        try:
            if self._store is None:
                self._store = store_actor()
            keys = sorted(set(self._known) | {key_id})
            self._reply = self._store.report.remote(dict(self._pending), keys).future()
            self._in_flight, self._pending = self._pending, Counter()
        except Exception as exc:  # noqa: BLE001
            log.warning("fleet quota store unavailable (%s): counting on this replica only", exc)
            self._pending.clear()  # never counted: the local guard holds meanwhile
