"""Batching across sessions: gather the sessions waiting for a verdict, run ONE forward.

Why not ``@serve.batch``: Serve's batcher forms the next batch while the previous forward is
still running and only then waits for the model. Under closed-loop load (every session sends
its next draft right after its verdict) a session that arrives during a forward is closed into
a batch of its own, and the sessions fall into alternating small batches (measured with 4
sessions and a 15 ms forward: mean batch 1.8). Here a batch is only gathered once the model is
free: whatever queued during the last forward, plus, for at most ``wait_s``, the sessions that
are about to come back (a lone session never waits).

Which sessions are about to come back (``gather_wait``): those whose next item is expected
within the wait, from the time their last result left and their measured return interval
(``ReturnTimes``). A speculative session on a slow link is away for most of a round; waiting
for it held every forward the whole ``wait_s`` for a draft that was tens of ms away. Without
``session`` (the old rule, kept for comparison) the gather waits until every open session is in.

One exception from the batch function reaches every caller of that batch; a result that is an
exception reaches only its own caller. A batch that returns other than one result per caller
fails them all (pairing results by position would otherwise leave
callers waiting forever, or hand a session another session's verdict).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, Hashable, Iterable, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

# Of each new return interval in a session's decayed mean: a change of k or of link shows within
# a few rounds, and one jittered round moves the estimate by only a quarter of its error.
RETURN_WEIGHT = 0.25


def gather_wait(now: float, deadline: float, arrivals: Iterable[float | None]) -> float:
    """How much longer a gather waits for more rows before its forward starts (0: start now).

    ``arrivals``: when each open session that is not in the batch yet is expected to send its
    next item (None: not known, e.g. a Generate stream, whose next step follows at once, or a
    session yet to send its first; expected now). The gather waits, at most until ``deadline``,
    only while one of them is expected by then: a session expected later would hold every row
    already in for nothing, and joins the next forward instead. One that is late (expected
    before ``now``) is still expected, until ``deadline``.
    """
    if now >= deadline:
        return 0.0
    if any(at is None or at <= deadline for at in arrivals):
        return deadline - now
    return 0.0


@dataclass
class _Away:
    left: float | None = None  # when its last result was handed back (None: it is in, or never was out)
    interval: float | None = None  # decayed mean of result handed back -> next item arrived


class ReturnTimes:
    """When each session's next item is expected: the time its last result left plus its
    measured return interval (link, drafting, the device's own time; ``RETURN_WEIGHT``)."""

    def __init__(self) -> None:
        self._sessions: dict[Hashable, _Away] = {}

    def arrived(self, session: Hashable, now: float) -> None:
        """``session``'s next item arrived: one more return interval measured."""
        away = self._sessions.setdefault(session, _Away())
        if away.left is not None:
            interval = now - away.left
            away.interval = interval if away.interval is None else (1 - RETURN_WEIGHT) * away.interval + RETURN_WEIGHT * interval
        away.left = None

    def left(self, session: Hashable, now: float) -> None:
        """``session``'s result was handed back: it is away until its next item arrives (a
        session already forgotten, its caller gone during the forward, stays forgotten)."""
        if (away := self._sessions.get(session)) is not None:
            away.left = now

    def forget(self, session: Hashable) -> None:
        """The session ended (nothing more will come)."""
        self._sessions.pop(session, None)

    def expected(self, session: Hashable) -> float | None:
        """When its next item should arrive (None: not known)."""
        away = self._sessions.get(session)
        if away is None or away.left is None or away.interval is None:
            return None
        return away.left + away.interval

    def away(self, open_sessions: int, present: list[Hashable | None]) -> list[float | None]:
        """The expected arrivals of the ``open_sessions`` not among ``present`` (the sessions of
        the items in the batch; None for an untracked one): each tracked session's, and None for
        each open one never tracked (Generate streams, sessions yet to send an item)."""
        here = set(present)
        tracked = [self.expected(session) for session in self._sessions if session not in here]
        untracked = max(open_sessions - len(present) - len(tracked), 0)
        return tracked + [None] * untracked


@dataclass
class GatherStats:
    """Counters of the gathers (rates derived here): how long the model, free with rows queued,
    waited for more before each forward, and how long the forwards then took."""

    gathers: int = 0
    waited_s: float = 0.0
    full_waits: int = 0  # gathers that waited until their deadline
    forward_s: float = 0.0  # from each batch's start to its results (the model thread's queue included)

    @property
    def mean_wait_ms(self) -> float:
        return 1000.0 * self.waited_s / self.gathers if self.gathers else 0.0

    @property
    def mean_forward_ms(self) -> float:
        return 1000.0 * self.forward_s / self.gathers if self.gathers else 0.0

    def to_dict(self) -> dict:
        return {"gathers": self.gathers, "waited_s": self.waited_s, "full_waits": self.full_waits,
                "forward_s": self.forward_s, "mean_wait_ms": self.mean_wait_ms, "mean_forward_ms": self.mean_forward_ms}


class BatchSizeMismatch(RuntimeError):
    """The batch function returned a number of results other than its number of items."""


class BatchScheduler(Generic[Item, Result]):
    def __init__(
        self,
        run: Callable[[list[Item]], Awaitable[list[Result]]],
        *,
        max_batch_size: int,
        wait_s: float,
        expected: Callable[[], int],
        on_batch: Callable[[list[Item], list[Result]], None] | None = None,
        session: Callable[[Item], Hashable | None] | None = None,
        clock: Callable[[], float] | None = None,
    ):
        """``expected``: how many sessions are open. ``session``: the session an item belongs
        to (None: one that is back at once, never tracked): with it the gather waits only for
        the sessions expected back within the wait (``gather_wait``), without it for every open
        one. ``clock``: seconds (default: the event loop's time)."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        self._run, self._expected, self._on_batch, self._session = run, expected, on_batch, session
        self._clock = clock
        self.max_batch_size, self.wait_s = max_batch_size, wait_s
        self.returns = ReturnTimes()
        self.stats = GatherStats()
        self._queue: list[tuple[Item, asyncio.Future]] = []
        self._arrival: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    async def submit(self, item: Item) -> Result:
        """Queues ``item`` for the next batch and waits for its result."""
        return await self._enqueue(item)

    def forget(self, session: Hashable) -> None:
        """``session`` ended: the gather no longer expects it back."""
        self.returns.forget(session)

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _wait_left(self, now: float, deadline: float) -> float:
        """How much longer this gather waits (0: the forward starts now)."""
        if len(self._queue) >= self.max_batch_size:
            return 0.0
        if self._session is None:  # every open session
            return deadline - now if len(self._queue) < max(self._expected(), 1) else 0.0
        present = [self._session(item) for item, _ in self._queue]
        return gather_wait(now, deadline, self.returns.away(self._expected(), present))

    async def _loop(self, arrival: asyncio.Event) -> None:
        """Runs batches while the loop that started it runs; ``arrival`` is set on each submit."""
        while True:
            # 1. The model is free: wait for a first arrival.
            while not self._queue:
                arrival.clear()
                await arrival.wait()
            # 2. Give the sessions about to come back up to wait_s to join before starting.
            started = self._now()
            deadline, timed_out = started + self.wait_s, False
            while (remaining := self._wait_left(self._now(), deadline)) > 0:
                arrival.clear()
                try:
                    await asyncio.wait_for(arrival.wait(), remaining)
                except asyncio.TimeoutError:
                    timed_out = True
                    break
            self._count_gather(self._now() - started, timed_out)
            # 3. One forward for the batch; each caller gets its result.
            live = self._take_batch()
            if not live:
                continue
            began = self._now()
            try:
                results = await self._run([item for item, _ in live])
            except Exception as exc:  # every caller of the batch gets it
                self._mark_left(live, began)
                _fail(live, exc)
                continue
            self._mark_left(live, began)
            self._deliver(live, results)

    def _count_gather(self, waited_s: float, timed_out: bool) -> None:
        self.stats.gathers += 1
        self.stats.waited_s += waited_s
        self.stats.full_waits += timed_out

    def _mark_left(self, live: list[tuple[Item, asyncio.Future]], began: float) -> None:
        """The batch's sessions get their results now (its forward began at ``began``): each is
        away until its next item."""
        now = self._now()
        self.stats.forward_s += now - began
        if self._session is None:
            return
        for item, _ in live:
            if (session := self._session(item)) is not None:
                self.returns.left(session, now)

    # The synchronous steps of submit and the loop, apart so that cpu_ledger.py can time them.

    def _enqueue(self, item: Item) -> asyncio.Future:
        """Queues ``item``, starting the loop on this event loop if it is not running; returns its future."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._arrival is None:
            self._arrival = asyncio.Event()
            self._task = loop.create_task(self._loop(self._arrival))
        future = loop.create_future()
        self._queue.append((item, future))
        if self._session is not None and (session := self._session(item)) is not None:
            self.returns.arrived(session, self._now())
        self._arrival.set()
        return future

    def _take_batch(self) -> list[tuple[Item, asyncio.Future]]:
        """The next batch off the queue, less the callers that went away."""
        batch, self._queue = self._queue[: self.max_batch_size], self._queue[self.max_batch_size :]
        return [(item, future) for item, future in batch if not future.cancelled()]

    def _deliver(self, live: list[tuple[Item, asyncio.Future]], results: list[Result]) -> None:
        """Hands each caller its result (every caller a ``BatchSizeMismatch`` when they do not pair)."""
        if not isinstance(results, list) or len(results) != len(live):
            got = len(results) if isinstance(results, list) else type(results).__name__
            _fail(live, BatchSizeMismatch(f"a batch of {len(live)} item(s) returned {got} result(s)"))
            return
        if self._on_batch is not None:
            self._on_batch([item for item, _ in live], results)
        for (_, future), result in zip(live, results):
            if future.done():
                continue
            if isinstance(result, BaseException):  # that item alone failed (see Verifier.step)
                future.set_exception(result)
            else:
                future.set_result(result)


def _fail(live: list[tuple[Any, asyncio.Future]], exc: Exception) -> None:
    """Every caller of the batch that still waits gets ``exc``."""
    for _, future in live:
        if not future.done():
            future.set_exception(exc)
