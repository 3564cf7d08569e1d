"""Admission for the device server: a few generations at once, a bounded queue, a bounded wait.

    gate = RequestGate(slots=4, queue=16, wait_s=30)
    with gate.admit():          # raises Busy at once when the queue is full (HTTP 429),
        ...generate...          # or after wait_s in the queue (HTTP 503); both carry retry_after_s

Waiters are served first come, first served: a freed slot goes to the head of the queue, never
to a newcomer that happens to ask at the right moment. No caller waits longer than ``wait_s``.
No I/O here: the HTTP layer turns ``Busy`` into a status code and a ``Retry-After`` header.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


class Busy(Exception):
    """No slot for this request: ``status`` 429 (queue full) or 503 (waited ``wait_s`` in vain)."""

    def __init__(self, message: str, status: int, retry_after_s: int):
        super().__init__(message)
        self.message, self.status, self.retry_after_s = message, status, retry_after_s


@dataclass
class _Waiter:
    event: threading.Event
    granted: bool = False


class RequestGate:
    """``slots`` generations run at once; up to ``queue`` more wait, each at most ``wait_s`` seconds."""

    def __init__(self, slots: int, queue: int, wait_s: float, *, retry_after_s: int = 1):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if queue < 0:
            raise ValueError(f"queue must be >= 0, got {queue}")
        if not wait_s >= 0:  # NOTE: `not >=` refuses NaN too
            raise ValueError(f"wait_s must be >= 0 seconds, got {wait_s}")
        self.slots, self.queue, self.wait_s, self.retry_after_s = slots, queue, wait_s, retry_after_s
        self._lock = threading.Lock()
        self._active = 0
        self._waiters: deque[_Waiter] = deque()

    @property
    def active(self) -> int:
        return self._active

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def acquire(self) -> None:
        """Takes a slot, waiting in line for at most ``wait_s``; raises Busy when it cannot."""
        with self._lock:
            if self._active < self.slots and not self._waiters:
                self._active += 1
                return
            if len(self._waiters) >= self.queue:
                raise Busy(f"the device server is busy: {self._active} generations running and {len(self._waiters)} "
                           f"waiting (the most it queues); retry later", 429, self.retry_after_s)
            waiter = _Waiter(threading.Event())
            self._waiters.append(waiter)
        deadline = time.monotonic() + self.wait_s
        while not waiter.event.wait(max(0.0, deadline - time.monotonic())):
            with self._lock:
                if waiter.granted:  # granted between the timeout and this lock: keep the slot
                    return
                if time.monotonic() >= deadline:
                    self._waiters.remove(waiter)
                    raise Busy(f"the device server is busy: no generation slot freed within {self.wait_s:g} s; "
                               "retry later", 503, self.retry_after_s)

    def release(self) -> None:
        """Frees a slot: hands it straight to the longest waiter, if any."""
        with self._lock:
            if self._waiters:
                waiter = self._waiters.popleft()
                waiter.granted = True  # the slot passes on: _active is unchanged
                waiter.event.set()
            else:
                self._active -= 1

    @contextmanager
    def admit(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def snapshot(self) -> dict:
        with self._lock:
            return {"active": self._active, "queued": len(self._waiters), "slots": self.slots, "queue": self.queue}
