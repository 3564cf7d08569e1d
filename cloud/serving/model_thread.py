"""The one thread that owns the model: jobs run one at a time, in the order they were submitted.

Forwards never overlap, and the event loop, which receives every session's messages, never
waits for one. The thread remembers when its current job started, so the replica's health
check can tell a stuck model (Serve then restarts the replica).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

log = logging.getLogger("ray.serve")


class ModelThread:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgespec-model")
        self._busy_since: float | None = None

    def _timed(self, fn: Callable[..., Any], *args, **kwargs):
        self._busy_since = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self._busy_since = None

    async def run(self, fn: Callable[..., Any], *args, **kwargs):
        """Runs ``fn`` on the model thread after every job submitted before it; awaits its result."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self._timed(fn, *args, **kwargs))

    def submit(self, fn: Callable[..., Any], *args) -> None:
        """Runs ``fn`` after the jobs before it, without waiting (its errors are logged)."""

        def job():
            try:
                self._timed(fn, *args)
            except Exception:
                log.exception("model-thread job %s failed", getattr(fn, "__name__", fn))

        self._executor.submit(job)

    def busy_for(self) -> float:
        """Seconds the current job has been running (0 when idle)."""
        since = self._busy_since
        return time.monotonic() - since if since is not None else 0.0

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
