"""Batching across sessions: gather the sessions waiting for a verdict, run ONE forward.

Why not ``@serve.batch``: Serve's batcher forms the next batch while the previous forward is
still running and only then waits for the model. Under closed-loop load (every session sends
its next draft right after its verdict) a session that arrives during a forward is closed into
a batch of its own, and the sessions fall into alternating small batches (measured with 4
sessions and a 15 ms forward: mean batch 1.8). Here a batch is only gathered once the model is
free: whatever queued during the last forward, plus, for at most ``wait_s``, the sessions that
are about to come back, until every open session is in (a lone session never waits).

One exception from the batch function reaches every caller of that batch; a result that is an
exception reaches only its own caller. A batch that returns other than one result per caller
fails them all (pairing results by position would otherwise leave
callers waiting forever, or hand a session another session's verdict).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


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
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        self._run, self._expected, self._on_batch = run, expected, on_batch
        self.max_batch_size, self.wait_s = max_batch_size, wait_s
        self._queue: list[tuple[Item, asyncio.Future]] = []
        self._arrival: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    async def submit(self, item: Item) -> Result:
        """Queues ``item`` for the next batch and waits for its result."""
        return await self._enqueue(item)

    async def _loop(self, arrival: asyncio.Event) -> None:
        """Runs batches while the loop that started it runs; ``arrival`` is set on each submit."""
        loop = asyncio.get_running_loop()
        while True:
            # The model is free: wait for a first arrival.
            while not self._queue:
                arrival.clear()
                await arrival.wait()
            # Give the other open sessions up to wait_s to join before starting.
            deadline = loop.time() + self.wait_s
            while len(self._queue) < min(self.max_batch_size, max(self._expected(), 1)):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                arrival.clear()
                try:
                    await asyncio.wait_for(arrival.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            live = self._take_batch()
            if not live:
                continue
            try:
                results = await self._run([item for item, _ in live])
            except Exception as exc:  # every caller of the batch gets it
                _fail(live, exc)
                continue
            self._deliver(live, results)

    # The synchronous steps of submit and the loop, apart so that cpu_ledger.py can time them.

    def _enqueue(self, item: Item) -> asyncio.Future:
        """Queues ``item``, starting the loop on this event loop if it is not running; returns its future."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._arrival is None:
            self._arrival = asyncio.Event()
            self._task = loop.create_task(self._loop(self._arrival))
        future = loop.create_future()
        self._queue.append((item, future))
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
