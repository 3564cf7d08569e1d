"""The SDK's shared event loop: blocking callers in one process run on one loop that is never
closed, so gRPC's asyncio completions never reach a closed loop (which printed "Exception in
callback PollerCompletionQueue._handle_events ... Event loop is closed" through every
benchmark; the end-to-end check, against a real server, is in tests/e2e/test_bench.py)."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from edgespec.edge import loop


def test_every_call_runs_on_one_loop_that_stays_open():
    async def which():
        return asyncio.get_running_loop()

    first, second = loop.run(which()), loop.run(which())
    assert first is second is loop.shared_loop()
    assert first.is_running() and not first.is_closed()


def test_an_error_reaches_the_caller_and_the_loop_survives_it():
    async def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        loop.run(fails())

    async def ok():
        return 7

    assert loop.run(ok()) == 7


def test_run_from_the_loops_own_thread_is_refused():
    async def nested():
        inner = asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="own thread"):
            loop.run(inner)
        return True

    assert loop.run(nested())


def test_a_failed_call_is_freed_at_once_not_by_the_garbage_collector():
    """A failed gRPC call's frames held its channel's connection, which kept retrying (a TLS
    handshake with the wrong CA, every few seconds) after the client was closed, until the
    garbage collector broke the cycle the raised error made through ``run``'s frame."""

    class Held:
        pass

    held: list[weakref.ref] = []

    async def fails():
        resource = Held()  # what the failed call's frame holds (its gRPC call, in the SDK)
        held.append(weakref.ref(resource))
        raise ValueError("boom")

    gc.disable()
    try:
        try:
            loop.run(fails())
        except ValueError:
            pass
        assert held[0]() is None, "the failed coroutine's frame outlived the error"
    finally:
        gc.enable()
