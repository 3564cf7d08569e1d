"""Where a replica's CPU goes per verify message: a ledger of thread CPU time by phase.

``edgespec bench overhead`` reads it (``VerifierDeployment.cpu_stats``) before and after a run
and divides by the messages: what is not in a named phase (Serve's gRPC ingress, asyncio,
other threads) is the process's CPU minus the phases. The phases, timed with
``time.thread_time_ns`` around synchronous code only:

    decode       wire message -> the session's types (a draft's tokens and q)
    validation   check_draft, quotas
    scheduling   the batch scheduler's own work on the event loop (queue, batch, results)
    bookkeeping  the model thread's work around the forward (rows, accept rule, committing rounds)
    forward      the target forward itself (not replica overhead: reported apart)
    encode       verdict -> wire message

Off unless ``VerifierConfig.profile_cpu``: then every phase costs one clock read pair.
"""

from __future__ import annotations

import time
from collections import defaultdict

PHASES = ("decode", "validation", "scheduling", "bookkeeping", "forward", "encode")


class CpuLedger:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.ns: dict[str, int] = defaultdict(int)
        self.messages = 0

    def clock(self) -> int:
        return time.thread_time_ns() if self.enabled else 0

    def add(self, phase: str, since: int) -> int:
        """Charges the CPU since ``since`` to ``phase``; returns the clock now (chain phases)."""
        if not self.enabled:
            return 0
        now = time.thread_time_ns()
        self.ns[phase] += now - since
        return now

    def snapshot(self) -> dict:
        return {"process_ns": time.process_time_ns(), "messages": self.messages, "phases": dict(self.ns)}
