"""The replica's step times as Info reports them: what the next forward will cost a device.

A device's planner reads ``forward_ms`` and ``decode_ms`` when it starts (before it has
measured anything itself) to choose between speculation and cloud-only streaming. An average
over every batch would still read a burst's batched step times long after the burst ended, and
steer devices away from the path that is now cheap. So each figure keeps two averages, over lone
steps and over batched ones, and reports the batched one only while batches keep coming.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

LOADED_FOR_S = 2.0  # a batched step older than this no longer describes the replica's load
WEIGHT = 0.1  # of each new step in the moving averages


@dataclass
class StepTime:
    lone_ms: float = 0.0
    batched_ms: float = 0.0
    last_batched: float = float("-inf")

    def add(self, ms: float, batch_size: int, now: float | None = None) -> None:
        if batch_size <= 1:
            self.lone_ms = ms if not self.lone_ms else (1 - WEIGHT) * self.lone_ms + WEIGHT * ms
            return
        recent = (now if now is not None else time.monotonic()) - self.last_batched < LOADED_FOR_S
        self.batched_ms = ms if not (self.batched_ms and recent) else (1 - WEIGHT) * self.batched_ms + WEIGHT * ms
        self.last_batched = now if now is not None else time.monotonic()

    def value(self, now: float | None = None) -> float:
        """The batched average while the replica is under load, else the lone one (0: unknown)."""
        loaded = (now if now is not None else time.monotonic()) - self.last_batched < LOADED_FOR_S
        if loaded and self.batched_ms:
            return self.batched_ms
        return self.lone_ms or self.batched_ms
