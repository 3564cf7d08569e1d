"""Where a replica's CPU goes per verify message: a ledger of thread CPU time by phase.

``edgespec bench overhead`` reads it (``VerifierDeployment.cpu_stats``) before and after a run
and divides by the messages: what is not in a named phase (Serve's gRPC ingress, asyncio,
other threads) is the process's CPU minus the phases. The phases, timed with
``time.thread_time_ns`` around synchronous methods only (each its own method so that it can be
wrapped; ``DEPLOYMENT_PHASES`` and below):

    decode       wire message -> the session's types (a request's kind, a draft's tokens and q)
    validation   check_draft, the key's quotas
    scheduling   the batch scheduler's own work on the event loop (queue, batch, results)
    bookkeeping  the model thread's work around the forward (rows, accept rule, committing rounds)
    forward      the target forward itself (not replica overhead: reported apart)
    encode       verdict -> wire message; each call is one verify message

A hook, off the hot path: with ``VerifierConfig.profile_cpu`` off nothing is installed and the
serving code makes no ledger calls; on, ``install`` wraps those methods on the replica's own
objects at construction (each costs one clock read pair). The quotas and the scheduler count
Generate's streams too (``bench overhead`` opens none).
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from typing import Any, Callable, TypeVar

PHASES = ("decode", "validation", "scheduling", "bookkeeping", "forward", "encode")

# The methods each phase times, {method: phase}, on the deployment, its quotas and its batch
# scheduler; the model thread's step is split into forward and bookkeeping apart (``_split_step``).
DEPLOYMENT_PHASES = {"_read_request": "decode", "_read_draft": "decode", "_validate": "validation", "_encode_verdict": "encode"}
QUOTA_PHASES = {"check_tokens": "validation", "charge": "validation"}
SCHEDULER_PHASES = {"_enqueue": "scheduling", "_take_batch": "scheduling", "_deliver": "scheduling"}

Fn = TypeVar("Fn", bound=Callable)


class CpuLedger:
    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.messages = 0  # verdicts encoded

    def install(self, deployment: Any) -> None:
        """Wraps the deployment's phase methods (``*_PHASES``) and its step so each charges this ledger."""
        owners = ((deployment, DEPLOYMENT_PHASES), (deployment.admission.quotas, QUOTA_PHASES),
                  (deployment.batches, SCHEDULER_PHASES))
        for owner, methods in owners:
            for name, phase in methods.items():
                setattr(owner, name, self.timed(phase, getattr(owner, name)))
        engine = getattr(deployment.verifier.backend, "engine", None)  # None: the engine runs in its own process
        deployment._step = self._split_step(deployment._step, engine)

    def timed(self, phase: str, fn: Fn) -> Fn:
        """``fn``, its thread CPU charged to ``phase`` (an encode is one more message)."""

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            started = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns[phase] += time.thread_time_ns() - started
                if phase == "encode":
                    self.messages += 1

        return timed  # pyright: ignore[reportReturnType]

    def _split_step(self, step: Fn, engine: Any) -> Fn:
        """``step``, its CPU split into the forward (the engine's own count) and the rest."""

        @functools.wraps(step)
        def timed(items):
            before = engine.forward_cpu_ns if engine is not None else 0
            started = time.thread_time_ns()
            try:
                return step(items)
            finally:
                forward = (engine.forward_cpu_ns if engine is not None else 0) - before
                self.ns["forward"] += forward
                self.ns["bookkeeping"] += time.thread_time_ns() - started - forward

        return timed  # pyright: ignore[reportReturnType]

    def snapshot(self) -> dict:
        return {"process_ns": time.process_time_ns(), "messages": self.messages, "phases": dict(self.ns)}
