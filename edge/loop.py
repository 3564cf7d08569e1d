"""One event loop, on one thread, for every blocking caller of the async SDK in a process.

gRPC's asyncio layer binds each event loop that uses it to one process-wide completion queue,
and a completion that arrives after its loop was closed (a channel's close finishing, a
cancelled call's last event) is delivered to that closed loop: "Exception in callback
PollerCompletionQueue._handle_events ... Event loop is closed", printed once per late event
(grpc/grpc#25364, #34139). A loop per client, or an ``asyncio.run`` per benchmark step, closes a
loop each time. Here the blocking client (``EdgeClient``) and the benchmarks' async steps
submit their coroutines to one loop that is never closed while the process lives, so no
completion can outlive its loop. (``cloud.bench.fleet.Fleet`` keeps a loop of its own, which
it stops but never closes.)
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def shared_loop() -> asyncio.AbstractEventLoop:
    """The process's SDK loop, started (on a daemon thread) at first use."""
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            _loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=_loop.run_forever, name="edgespec-loop", daemon=True)
            _thread.start()
        return _loop


def submit(coroutine: Coroutine[Any, Any, T]) -> "Future[T]":
    """Schedules ``coroutine`` on the shared loop; its concurrent future."""
    return asyncio.run_coroutine_threadsafe(coroutine, shared_loop())


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs ``coroutine`` on the shared loop and waits for it (``asyncio.run`` for callers
    outside it). An interrupt while waiting cancels the work on the loop too."""
    if threading.current_thread() is _thread:
        coroutine.close()
        raise RuntimeError("edgespec.edge.loop.run called from the shared loop's own thread: await the coroutine instead")
    future = submit(coroutine)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
    finally:
        # A raised error's traceback holds this frame, and this frame the future that holds the
        # error: a cycle that only the garbage collector ends. Until it runs, the failed call's
        # frames keep its gRPC channel's connection retrying, closed channel or not.
        del future
