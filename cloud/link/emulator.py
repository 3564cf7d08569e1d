"""A network link between device and cloud, emulated in user space as a TCP proxy.

This kernel has no ``netem`` (DESIGN decision 9), so delay, jitter, bandwidth and loss are
applied by an asyncio proxy that forwards bytes and never parses them: gRPC, HTTP/2 and TLS
pass through unchanged. Each direction of each connection follows ``DirectionSchedule``
(``profiles.py``): base delay + jitter, serialisation at the profile's bandwidth, a
retransmission stall per lost segment, order always preserved. Bandwidth and order are per
connection: each connection is treated as its own device's access link.

Faults, for testing retries and resumes:

- **reset**: every live connection is closed with an RST (SO_LINGER 0) on both sides, on demand
  (``reset_all()``) or ``reset_after_s`` seconds after each connection opened;
- **stall**: forwarding pauses in both directions for a while, on demand (``stall(s)``) or on a
  schedule (every ``stall_every_s`` seconds for ``stall_for_s``); bytes are held, never lost.

Python::

    with LinkEmulator("127.0.0.1:9000", PROFILES["4g"]) as link:
        client = EdgeClient(link.address, ...)

Command line (runs until Ctrl-C; SIGUSR1 resets every connection, SIGUSR2 stalls)::

    edgespec link --listen 9100 --upstream 127.0.0.1:9000 --link 4g
    edgespec link --listen 9100 --upstream 127.0.0.1:9000 --rtt 80 --jitter 10 --bandwidth 5 --loss 0.5
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from dataclasses import dataclass

from edgespec.cloud.link.profiles import DirectionSchedule, Faults, LinkProfile

READ_BYTES = 16 * 1024  # small enough that bandwidth shaping is smooth, big enough to be cheap
MIN_QUEUE_BYTES = 256 * 1024  # bytes held per direction before the proxy stops reading
CONNECT_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 10.0
SHUTDOWN_WAIT_S = 2.0


@dataclass
class LinkStats:
    """Counters since start; bytes are counted when forwarded (after the link's delay)."""

    bytes_up: int = 0
    bytes_down: int = 0
    connections: int = 0
    active: int = 0
    resets: int = 0
    stalls: int = 0
    upstream_failures: int = 0
    # The delay the link model gave each chunk (release - arrival, ms), summed per direction.
    delay_ms_up: float = 0.0
    delay_ms_down: float = 0.0
    chunks_up: int = 0
    chunks_down: int = 0
    # How late the emulator itself wrote each chunk after its release time (its event loop's
    # timers and CPU on shared cores, not the link model), summed over both directions.
    late_ms: float = 0.0
    late_chunks: int = 0

    def line(self) -> str:
        return (
            f"connections {self.connections} (active {self.active}), up {_size(self.bytes_up)}, "
            f"down {_size(self.bytes_down)}, resets {self.resets}, stalls {self.stalls}, "
            f"upstream failures {self.upstream_failures}"
        )


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def parse_address(address: tuple[str, int] | str) -> tuple[str, int]:
    if isinstance(address, tuple):
        host, port = address
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ValueError(f"upstream must be HOST:PORT, got {address!r}")
        host, port = host.strip("[]"), int(port_text)
    if not 0 < int(port) < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    return host or "127.0.0.1", int(port)


def _abort_with_rst(writer: asyncio.StreamWriter | None) -> None:
    if writer is None:
        return
    sock = writer.transport.get_extra_info("socket")
    if sock is not None:
        try:
            # NOTE: linger on with timeout 0 makes close() send RST instead of FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class _Pipe:
    """One direction of one connection: read, schedule, hold, write, in order."""

    def __init__(self, link: "LinkEmulator", reader, writer, schedule: DirectionSchedule | None, direction: str):
        self.link, self.reader, self.writer = link, reader, writer
        self.schedule, self.direction = schedule, direction
        self.queue: asyncio.Queue = asyncio.Queue()
        self.queued_bytes = 0
        self.room = asyncio.Event()
        self.room.set()
        rate = schedule.bandwidth_mbit if schedule else 0.0
        rtt = link.profile.rtt_ms + link.profile.rto_ms if schedule else 0.0
        # Hold at most about one bandwidth-delay product (or 256 KiB): beyond that the
        # sender feels back-pressure, as it would from a real bottleneck's buffer.
        self.max_queue_bytes = max(MIN_QUEUE_BYTES, int(rate * 1e6 / 8 * rtt / 1000))

    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await self.reader.read(READ_BYTES):
                now_ms = loop.time() * 1000.0
                self.link._last_traffic = now_ms / 1000.0
                release = self.schedule.release_ms(now_ms, len(data)) if self.schedule else now_ms
                self.link._delayed(self.direction, release - now_ms)
                self.queued_bytes += len(data)
                self.queue.put_nowait((data, release))
                if self.queued_bytes >= self.max_queue_bytes:
                    self.room.clear()
                    await self.room.wait()
        finally:
            self.queue.put_nowait((None, 0.0))  # EOF (or error) follows the bytes already held

    async def write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data, release_ms = await self.queue.get()
            wait_s = release_ms / 1000.0 - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            await self.link._wait_unstalled()
            if data is None:
                if not self.writer.transport.is_closing() and self.writer.can_write_eof():
                    self.writer.write_eof()  # a half-close travels like any other byte
                return
            self.link._late(loop.time() * 1000.0 - release_ms)
            # Counted before they are handed to the socket: write() sends at once, and the peer
            # (in another thread) may read them, and the stats, before this thread runs again.
            self.link._count(self.direction, len(data))
            self.writer.write(data)
            await self.writer.drain()
            self.queued_bytes -= len(data)
            self.link._last_traffic = loop.time()
            if self.queued_bytes < self.max_queue_bytes:
                self.room.set()


class _Connection:
    def __init__(self, client_writer, upstream_writer, index: int):
        self.writers = (client_writer, upstream_writer)
        self.index = index
        self.pipes: list[_Pipe] = []
        self.task: asyncio.Task | None = None
        self.reset_timer: asyncio.TimerHandle | None = None

    def abort(self) -> None:
        for writer in self.writers:
            _abort_with_rst(writer)

    def reset(self) -> None:
        self.abort()
        if self.task is not None:
            self.task.cancel()


class LinkEmulator:
    """A TCP proxy on ``listen_host:listen_port`` that forwards to ``upstream`` over an emulated link.

    Use as a context manager (or ``start()``/``close()``): the proxy runs its own event loop
    in a background thread, so blocking test code and other event loops can use it.
    """

    def __init__(
        self,
        upstream: tuple[str, int] | str,
        profile: LinkProfile,
        *,
        listen_port: int = 0,
        listen_host: str = "127.0.0.1",
        seed: int = 0,
        faults: Faults | None = None,
    ):
        if not isinstance(profile, LinkProfile):
            raise TypeError(f"profile must be a LinkProfile, got {type(profile).__name__}")
        if not 0 <= listen_port < 65536:
            raise ValueError(f"listen_port must be in 0..65535 (0 = any free port), got {listen_port}")
        self.upstream = parse_address(upstream)
        self.profile = profile
        self.listen_host = listen_host
        self.seed = seed
        self.faults = faults or Faults()
        self.stats = LinkStats()
        self.port = listen_port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()
        self._background: set[asyncio.Task] = set()
        self._draw_key: str | None = None  # reseed(): draws keyed by a measurement, not a connection
        self._stalled_until = 0.0  # loop time (s)
        self._last_traffic = 0.0  # loop time (s) a chunk was last read or written, either direction
        self._unstalled: asyncio.Event | None = None

    # ---- public API (any thread) --------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    @property
    def bytes_up(self) -> int:
        return self.stats.bytes_up

    @property
    def bytes_down(self) -> int:
        return self.stats.bytes_down

    @property
    def connections(self) -> int:
        return self.stats.connections

    @property
    def resets(self) -> int:
        return self.stats.resets

    def start(self) -> "LinkEmulator":
        if self._thread is not None:
            raise RuntimeError("LinkEmulator already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), name="edgespec-link", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def close(self) -> None:
        if self._thread is None:
            return
        loop = self._loop
        if loop is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(CONTROL_TIMEOUT_S)
            finally:
                loop.call_soon_threadsafe(loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)
        self._thread = None

    def __enter__(self) -> "LinkEmulator":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def reset_all(self) -> int:
        """Resets (RST) every live connection now; returns how many. New connections still work."""
        return self._call(self._reset_all)

    def set_profile(self, profile: LinkProfile) -> None:
        """From now on every connection, live or new, follows ``profile`` (chunks already held keep
        their release times): a link that gets slow, or fast again, mid-generation."""
        if not isinstance(profile, LinkProfile):
            raise TypeError(f"profile must be a LinkProfile, got {type(profile).__name__}")

        def apply():
            self.profile = profile
            for connection in self._connections:
                for pipe in connection.pipes:
                    if pipe.schedule is not None:
                        pipe.schedule.use_profile(profile)
                    elif not profile.is_transparent:
                        pipe.schedule = self._schedule(connection.index, pipe.direction, force=True)

        self._call(apply)

    def reseed(self, key: str) -> None:
        """Restarts the random draws (jitter, loss) of every direction, on live connections and
        later ones, from ``seed`` and ``key`` alone. A benchmark that reseeds with the same key
        before each arm's run of one text gives every arm the same draws, chunk by chunk (common
        random numbers): on a lossy link, which arm happened to meet a loss no longer decides
        which is faster. Bytes already held keep their release times."""

        def apply():
            self._draw_key = key
            for connection in self._connections:
                for pipe in connection.pipes:
                    if pipe.schedule is not None:
                        pipe.schedule.uniform = self._uniform(connection.index, pipe.direction)

        self._call(apply)

    def wait_quiet(self, quiet_s: float, timeout_s: float) -> float:
        """Waits until no byte is held in either direction of any connection and none has been
        read or written for ``quiet_s``, or ``timeout_s`` has passed; returns the seconds waited.
        Between a benchmark's measurements: the replies still on their way to one (a block sent
        ahead, a session's close) must not take the next one's draws, or hold its first bytes
        behind a lost one of theirs."""
        if not quiet_s >= 0 or not timeout_s >= 0:
            raise ValueError(f"quiet_s and timeout_s must be >= 0, got {quiet_s} and {timeout_s}")

        async def quiet() -> float:
            loop = asyncio.get_running_loop()
            started = loop.time()
            while loop.time() - started < timeout_s:
                held = any(pipe.queued_bytes for connection in self._connections for pipe in connection.pipes)
                idle = loop.time() - self._last_traffic
                if not held and idle >= quiet_s:
                    break
                await asyncio.sleep(max(quiet_s - idle, 0.01) if not held else 0.01)
            return loop.time() - started

        return self._submit(quiet, timeout_s + CONTROL_TIMEOUT_S)

    def stall(self, seconds: float) -> None:
        """Pauses forwarding in both directions for ``seconds`` from now (extends a running stall)."""
        if not seconds > 0:
            raise ValueError(f"seconds must be > 0, got {seconds}")
        self._call(lambda: self._stall(seconds))

    # ---- event loop side ---------------------------------------------------------------

    def _call(self, fn):
        async def invoke():
            return fn()

        return self._submit(invoke, CONTROL_TIMEOUT_S)

    def _submit(self, coroutine_fn, timeout_s: float):
        """Runs ``coroutine_fn()`` on the link's loop and waits up to ``timeout_s`` for it."""
        if self._loop is None or self._thread is None:
            raise RuntimeError("LinkEmulator is not running: use it as a context manager or call start()")
        return asyncio.run_coroutine_threadsafe(coroutine_fn(), self._loop).result(timeout_s)

    def _run(self, ready: threading.Event, failure: list) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                return
            self._loop = loop  # before ready: control calls may follow start() at once
            ready.set()
            loop.run_forever()
        finally:
            ready.set()
            self._loop = None
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _open(self) -> None:
        self._unstalled = asyncio.Event()
        self._unstalled.set()
        self._server = await asyncio.start_server(self._handle, self.listen_host, self.port, backlog=256)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.faults.stall_every_s is not None:
            self._spawn(self._stall_schedule())

    async def _shutdown(self) -> None:
        self._server.close()
        for connection in list(self._connections):
            connection.reset()
        tasks = [c.task for c in self._connections if c.task] + list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:  # every connection is reset already; never let a straggler hold the stop up
            await asyncio.wait_for(self._server.wait_closed(), SHUTDOWN_WAIT_S)
        except asyncio.TimeoutError:
            pass

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _delayed(self, direction: str, ms: float) -> None:
        if direction == "up":
            self.stats.delay_ms_up += ms
            self.stats.chunks_up += 1
        else:
            self.stats.delay_ms_down += ms
            self.stats.chunks_down += 1

    def _late(self, ms: float) -> None:
        self.stats.late_ms += max(ms, 0.0)
        self.stats.late_chunks += 1

    def _count(self, direction: str, nbytes: int) -> None:
        if direction == "up":
            self.stats.bytes_up += nbytes
        else:
            self.stats.bytes_down += nbytes

    def _reset_all(self) -> int:
        connections = list(self._connections)
        for connection in connections:
            connection.reset()
        self.stats.resets += len(connections)
        return len(connections)

    def _stall(self, seconds: float) -> None:
        now = asyncio.get_running_loop().time()
        self._stalled_until = max(self._stalled_until, now + seconds)
        self.stats.stalls += 1
        self._unstalled.clear()
        asyncio.get_running_loop().call_at(self._stalled_until, self._end_stall)

    def _end_stall(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() >= self._stalled_until:
            self._unstalled.set()
        else:  # extended since, or the timer fired a hair early
            loop.call_at(self._stalled_until, self._end_stall)

    async def _wait_unstalled(self) -> None:
        while not self._unstalled.is_set():
            await self._unstalled.wait()

    async def _stall_schedule(self) -> None:
        while True:
            await asyncio.sleep(self.faults.stall_every_s)
            self._stall(self.faults.stall_for_s)

    async def _handle(self, client_reader, client_writer) -> None:
        self.stats.connections += 1
        index = self.stats.connections
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), CONNECT_TIMEOUT_S
            )
        except (OSError, asyncio.TimeoutError):
            # The device sees what it would see from an unreachable server: a reset.
            self.stats.upstream_failures += 1
            _abort_with_rst(client_writer)
            return
        connection = _Connection(client_writer, upstream_writer, index)
        connection.task = asyncio.current_task()
        self._connections.add(connection)
        self.stats.active += 1
        if self.faults.reset_after_s is not None:
            connection.reset_timer = asyncio.get_running_loop().call_later(
                self.faults.reset_after_s, self._reset_one, connection
            )
        pipes = connection.pipes = [
            _Pipe(self, client_reader, upstream_writer, self._schedule(index, "up"), "up"),
            _Pipe(self, upstream_reader, client_writer, self._schedule(index, "down"), "down"),
        ]
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(fn()) for pipe in pipes for fn in (pipe.read_loop, pipe.write_loop)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if any(not t.cancelled() and t.exception() is not None for t in done):
                # One side failed: the other must not linger half-open, so both get an RST.
                connection.abort()
        except asyncio.CancelledError:
            pass  # reset_all(), reset_after_s or shutdown: the transports are already aborted
        finally:
            if connection.reset_timer is not None:
                connection.reset_timer.cancel()
            self._connections.discard(connection)
            self.stats.active -= 1
            for writer in connection.writers:
                if not writer.transport.is_closing():
                    writer.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _reset_one(self, connection: _Connection) -> None:
        if connection in self._connections:
            connection.reset()
            self.stats.resets += 1

    def _schedule(self, index: int, direction: str, force: bool = False) -> DirectionSchedule | None:
        if self.profile.is_transparent and not force:
            return None
        return DirectionSchedule(self.profile, direction, self._uniform(index, direction))

    def _uniform(self, index: int, direction: str):
        # One RNG per connection and direction: draws do not depend on how traffic interleaves.
        # After reseed(key), per key and direction: every connection replays the same draws.
        source = f"key={self._draw_key}" if self._draw_key is not None else index
        return random.Random(f"{self.seed}/{source}/{direction}").random
