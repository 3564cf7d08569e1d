"""Where the target runs: the KV caches, the batched forward and the accept rule.

``LocalBackend`` (the default) runs the model in the replica process, on the replica's model
thread. A transformers forward is mostly Python code that holds the GIL while it runs, which
delays the event loop that receives other sessions' drafts; ``ProcessBackend``
(``engine_process: true``) moves the same code into a child process, so the model thread only
waits on a pipe (releasing the GIL) and a dead engine fails the replica's health check. On 2
shared CPU cores the extra process cost ~13% of verify throughput at 16 sessions, so it is not
the default there; the batch scheduler, not the process split, is what lets sessions share
forwards (see scheduler.py).

Per verification, each session contributes a ``Row``. Its cache is first trimmed to
``cache_len`` (the committed tokens before the pending one: rejected drafts of the previous
round fall off here and their pages return to the pool), then the row's tokens (pending token +
drafts) are fed in one packed forward with the other rows, and the accept rule returns
(accepted, next token). A pool with no page left answers RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import AsyncGenerator, Protocol

import grpc

from edgespec.cloud.serving.accept import Outcome, Row, accept_rows
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.cloud.serving.kv_pool import PoolExhausted
from edgespec.edge.errors import ServerError, status_error
from edgespec.edge.params import Mode, SamplingParams


@dataclass(frozen=True)
class BackendInfo:
    vocab_size: int
    max_context: int
    tokenizer_fingerprint: str
    params: int
    kv_bytes_per_token: int
    description: dict
    can_verify_trees: bool = False  # the packed path serves it: trees (and batches) work
    kv_page_tokens: int = 1  # the KV pool's page: a session holds whole pages
    kv_pool_bytes: int = 0  # the KV pool's size (the admission budget); 0: nothing pinned per session
    modes: frozenset[Mode] = frozenset(Mode)  # verification modes served; others are refused at Open


class ContinuousBackend(Protocol):
    """A backend that batches sessions' requests itself (``vllm_backend.VllmBackend``): the replica
    awaits each session's call as it comes, with no model thread and no batch scheduler between."""

    info: BackendInfo
    continuous: bool

    async def open(self, key: int, prefix: list[int]) -> None: ...

    async def verify(self, row: Row, context: list[int]) -> Outcome: ...

    def decode(self, key: int, context: list[int], sampling: SamplingParams, max_tokens: int,
               stop_ids: frozenset[int]) -> AsyncGenerator[list[int], None]: ...

    def close(self, key: int) -> None: ...

    def shutdown(self) -> None: ...


class BackendError(RuntimeError):
    """The model backend failed (its process died, or a forward raised)."""


TRIM_AFTER_BYTES = 64 << 20  # freed KV after which the heap is trimmed (and whenever the last session ends)


def release_free_memory() -> None:
    """Hands the allocator's free pages back to the OS (glibc's malloc_trim): freed KV caches
    otherwise stay in the process's heap, and a replica that served a burst of sessions would
    keep their peak as its resident size. A no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class LocalBackend:
    """The target in this process."""

    def __init__(self, config: VerifierConfig):
        from edgespec.cloud.serving.engine import TargetEngine

        self.engine = TargetEngine(config)
        self.caches: dict = {}
        self._freed = 0  # KV bytes freed since the allocator last gave memory back
        engine = self.engine
        self.info = BackendInfo(
            vocab_size=engine.vocab_size,
            max_context=engine.max_context,
            tokenizer_fingerprint=engine.tokenizer_fingerprint,
            params=engine.params,
            kv_bytes_per_token=engine.kv_bytes_per_token(),
            description=engine.describe(),
            can_verify_trees=engine.can_batch,
            kv_page_tokens=engine.page_tokens if engine.path == "paged" else 1,
            kv_pool_bytes=min(config.max_kv_bytes, engine.pool.num_pages * engine.page_tokens * engine.kv_bytes_per_token())
            if engine.path == "paged" else config.max_kv_bytes,
        )

    def open(self, key: int, prefix: list[int]) -> None:
        kv = self.engine.new_kv()
        self.caches[key] = kv
        with _exhaustion_refused():
            self.engine.prefill(kv, prefix)

    def extend(self, key: int, tokens: list[int]) -> None:
        """Feeds ``tokens`` into an open session's cache (one prefill chunk)."""
        if key not in self.caches:
            raise BackendError(f"no cache for session {key}: it was closed or never opened")
        with _exhaustion_refused():
            self.engine.prefill(self.caches[key], tokens)

    def close(self, key: int) -> None:
        kv = self.caches.pop(key, None)
        if kv is None:
            return
        self._freed += kv.nbytes()
        self.engine.release(kv)  # its pages go back to the pool
        if self._freed >= TRIM_AFTER_BYTES or not self.caches:
            release_free_memory()
            self._freed = 0

    def verify(self, rows: list[Row]) -> list[Outcome]:
        """One packed forward over every row, then the accept rule per mode."""
        for row in rows:
            if row.key not in self.caches:
                raise BackendError(f"no cache for session {row.key}: it was closed or never opened")
            self.engine.trim(self.caches[row.key], row.cache_len)
        with _exhaustion_refused():
            logits = self.engine.forward([(self.caches[row.key], row.tokens) for row in rows], [row.tree for row in rows])
        outcomes = accept_rows(rows, logits, self.engine.last_logits)
        for row, outcome in zip(rows, outcomes):
            if outcome.path is not None:  # a tree: keep the pending token and the accepted path only
                self.engine.keep_path(self.caches[row.key], row.cache_len, [0] + [1 + i for i in outcome.path])
        return outcomes

    def shutdown(self) -> None:
        for kv in self.caches.values():
            self.engine.release(kv)
        self.caches.clear()


class _exhaustion_refused:
    """A full KV pool is the caller's RESOURCE_EXHAUSTED, not an internal error."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, PoolExhausted):
            raise status_error(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc} (retry after 1s)") from None
        return False


# ---- the child process ------------------------------------------------------------------


def _write(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _read(stream):
    header = stream.read(4)
    if len(header) < 4:
        raise EOFError("the engine process closed its pipe")
    (size,) = struct.unpack("<I", header)
    return pickle.loads(stream.read(size))


def worker_main() -> None:
    """Entry point of the engine process: requests on stdin, replies on stdout."""
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed by libraries must not corrupt the reply stream
    config = VerifierConfig.from_dict(_read(requests))
    try:
        backend = LocalBackend(config)
    except Exception as exc:  # reported to the replica, which fails its start with it
        _write(replies, ("error", f"loading {config.model}: {exc!r}"))
        return
    _write(replies, ("ok", backend.info))
    while True:
        try:
            op, args = _read(requests)
        except EOFError:
            return
        if op == "stop":
            return
        try:
            _write(replies, ("ok", getattr(backend, op)(*args)))
        except ServerError as exc:  # keeps its status code across the pipe
            _write(replies, ("status", (exc.code.name, exc.details)))
        except Exception as exc:
            _write(replies, ("error", f"{op} failed: {exc!r}"))


class ProcessBackend:
    """The target in a child process; calls block the calling thread (not the GIL) on a pipe."""

    def __init__(self, config: VerifierConfig):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from edgespec.cloud.serving.backend import worker_main; worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._lock = threading.Lock()
        _write(self.process.stdin, config.to_dict())
        status, payload = self._reply()
        if status != "ok":
            self.shutdown()
            raise BackendError(payload)
        self.info: BackendInfo = payload

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def _reply(self):
        try:
            return _read(self.process.stdout)
        except (EOFError, OSError) as exc:
            raise BackendError(f"the engine process died (exit code {self.process.poll()}): {exc}") from None

    def _call(self, op: str, *args):
        with self._lock:
            if not self.alive:
                raise BackendError(f"the engine process is not running (exit code {self.process.poll()})")
            try:
                _write(self.process.stdin, (op, args))
            except (BrokenPipeError, OSError) as exc:
                raise BackendError(f"the engine process died: {exc}") from None
            status, payload = self._reply()
        if status == "status":
            raise status_error(getattr(grpc.StatusCode, payload[0]), payload[1])
        if status != "ok":
            raise BackendError(payload)
        return payload

    def open(self, key: int, prefix: list[int]) -> None:
        self._call("open", key, prefix)

    def extend(self, key: int, tokens: list[int]) -> None:
        self._call("extend", key, tokens)

    def close(self, key: int) -> None:
        self._call("close", key)

    def verify(self, rows: list[Row]) -> list[Outcome]:
        return self._call("verify", rows)

    def shutdown(self) -> None:
        if self.alive:
            try:
                with self._lock:
                    _write(self.process.stdin, ("stop", ()))
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()


def make_backend(config: VerifierConfig) -> LocalBackend | ProcessBackend | ContinuousBackend:
    """The backend ``config`` asks for: transformers in this process or a child, or vLLM."""
    if config.backend == "vllm":
        from edgespec.cloud.serving.vllm_backend import VllmBackend

        return VllmBackend(config)
    return ProcessBackend(config) if config.engine_process else LocalBackend(config)
