"""A fleet of devices generating back to back against one endpoint, resizable while it runs.

What the scale-out rehearsals need (``tests/e2e/test_cluster.py``, ``edgespec bench spread``):
``size`` devices, each on its own channel (its own connection through the ingress, as real
devices are), each running one generation after another over a list of prompts until it is
told to stop. Growing the fleet ramps the load; shrinking it lets the devices past the new
size finish the generation they are in and leave. Every finished generation is kept
(``results``) so the caller can check each one against the target's own output, and see the
replica each stream landed on and how many times a session moved.

Runs in its own thread with its own event loop (one AsyncEdgeClient per device, one draft
thread each), so a test or a benchmark drives it from ordinary blocking code.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from edgespec.cloud.bench.connection import connection_to
from edgespec.edge.aclient import AsyncEdgeClient
from edgespec.edge.types import Result


@dataclass
class FleetResult:
    device: int
    prompt: int  # index into the fleet's prompts
    result: Result
    finished_at: float  # time.monotonic()


class Fleet:
    """``prompts``: token-id lists; ``params``: GenerationParams fields for every generation
    (``cloud_only_devices``: that many devices, the first ones, stream cloud-only instead)."""

    def __init__(self, address: str, draft_dir: str | Path, prompts: Sequence[Sequence[int]], *,
                 cloud_only_devices: int = 0, max_retries: int = 60, **params: Any):
        if not prompts:
            raise ValueError("a fleet needs at least one prompt")
        self.address, self.draft_dir = address, str(draft_dir)
        self.prompts = [list(p) for p in prompts]
        self.params, self.cloud_only_devices, self.max_retries = params, cloud_only_devices, max_retries
        self.results: list[FleetResult] = []
        self.errors: list[tuple[int, BaseException]] = []
        self._size = 0
        self._tasks: dict[int, asyncio.Task] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="edgespec-fleet", daemon=True)
        self._thread.start()

    @property
    def size(self) -> int:
        return self._size

    def resize(self, size: int) -> None:
        """Starts devices up to ``size``; devices at or past it leave after their generation."""
        if size < 0:
            raise ValueError(f"a fleet's size is >= 0, got {size}")
        self._size = size
        for device in range(size):
            task = self._tasks.get(device)
            if task is None or task.done():
                self._tasks[device] = asyncio.run_coroutine_threadsafe(self._device(device), self._loop)

    def running(self) -> int:
        """Devices still running (some may be finishing their last generation)."""
        return sum(1 for task in self._tasks.values() if not task.done())

    def stop(self, timeout_s: float = 120.0) -> None:
        """Shrinks to nothing and waits for every device to finish its generation."""
        self.resize(0)
        deadline = time.monotonic() + timeout_s
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.running():
            raise TimeoutError(f"{self.running()} device(s) still generating after {timeout_s:g}s")

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    async def _device(self, device: int) -> None:
        params = dict(self.params)
        if device < self.cloud_only_devices:
            params["speculate"] = False
        round_no = 0
        async with AsyncEdgeClient(self.address, self.draft_dir, max_retries=self.max_retries,
                                   **connection_to(self.address).client_options()) as client:
            while device < self._size:
                prompt = (device + round_no) % len(self.prompts)
                round_no += 1
                try:
                    result = await client.generate(self.prompts[prompt], **params)
                except Exception as exc:  # kept for the caller to report; this device stops
                    self.errors.append((device, exc))
                    return
                self.results.append(FleetResult(device, prompt, result, time.monotonic()))
