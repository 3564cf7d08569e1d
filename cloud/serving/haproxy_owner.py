"""Serve's HAProxy, owned by the process that starts Ray: its own ports, files, and end.

Serve's HAProxy ingress (``ingress.py``) spawns ``haproxy`` from the proxy actor with
settings Ray reads from the environment at import, in every Ray process. Left at Ray's
defaults, every Serve on a machine shares one config file and admin socket
(``/tmp/haproxy-serve``) and the stats/metrics ports 8404 and 9101 on all interfaces, and a
Serve whose driver is SIGKILLed leaves its HAProxy re-parented to init, holding those ports:
the next Serve on the machine fails at start ("cannot bind socket").

``HAProxyOwner.claim`` fixes that before Ray starts:

- a private state directory (config file, admin socket, server state) per owner, so two
  serves on one machine never touch each other's HAProxy;
- stats and metrics ports from the caller or chosen free, in ``PORT_RANGE`` (outside Linux's
  ephemeral range, which Ray's processes draw from when they bind port 0, and outside Ray's
  worker and replica port ranges);
- the ports of Serve's fallback proxy (where HAProxy sends what no replica takes directly) chosen
  free too, and a window of its own for the replicas' direct-ingress ports: Ray's defaults (9500
  and 8500; replicas from 40000 and 30000 up) are the same for every Serve and bound with
  SO_REUSEPORT, so two Serves on one machine both listened on them and the kernel split
  connections between them (a client of one reached the other's model: seen as "tokenizer
  mismatch" and foreign API-key errors between concurrent tests);
- those two listeners on loopback unless ``expose_stats``: Ray's template binds them on all
  interfaces, so ``RAY_SERVE_HAPROXY_BINARY_PATH`` points at a two-line wrapper that rewrites
  their ``bind`` lines in the config HAProxy is started with, then execs the real binary;
- a state file naming the owner (pid and start time): ``claim`` first reaps the HAProxy of
  every owner that is gone (SIGKILLed), and ``stop`` ends this owner's own.

HAProxy processes are recognised by identity, never by name: a process is ours only if its
command line is ``haproxy ... -f <our config file>`` (as Ray's own manager checks).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

# Ray: workers 10002-19999, replica HTTP 30000-31000, replica gRPC 40000-41000; Linux's
# ephemeral range (bind to port 0) starts at 32768. This range is none of them.
PORT_RANGE = (20000, 29999)
STATE_FILE = "owner.json"
SOCKET_PATH_MAX = 97  # HAProxy refuses longer unix socket paths
CONFIG_FILE = "haproxy.cfg"
CONFIG_VARIABLE = "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"  # the owner's config path, in every process it starts


def state_root() -> Path:
    """Where owners keep their state: ``EDGESPEC_STATE_DIR``, else one folder per user in /tmp.

    Kept short: Ray puts the admin socket at ``<dir>/<56-hex node id>/admin.sock`` and HAProxy
    refuses a socket path over 97 characters."""
    return Path(os.environ.get("EDGESPEC_STATE_DIR") or f"/tmp/esv-{os.getuid()}")


_handed_out: set[int] = set()  # never the same port twice from one process (the first may not be bound yet)
# ...nor from two processes of this user: a port handed out is reserved here for RESERVE_S. Two
# serves starting side by side each draw ports that stay free until their HAProxy binds them;
# HAProxy binds with SO_REUSEPORT, so a port drawn twice is shared, not refused, and one serve's
# clients may reach the other's HAProxy frontend.
RESERVATIONS = Path(f"/tmp/edgespec-ports-{os.getuid()}")
RESERVE_S = 300.0


def free_port(host: str = "127.0.0.1", avoid: set[int] | frozenset[int] = frozenset()) -> int:
    """A port in ``PORT_RANGE`` nothing listens on now (bind-tested on ``host`` and all
    interfaces) that no process of this user was handed in the last ``RESERVE_S`` seconds."""
    low, high = PORT_RANGE
    start = low + (os.getpid() * 7919 + time.monotonic_ns()) % (high - low)  # spread concurrent callers
    for offset in range(high - low + 1):
        port = low + (start - low + offset) % (high - low + 1)
        if (port not in avoid and port not in _handed_out and _bindable(port, host) and _bindable(port, "0.0.0.0")
                and _reserve(port)):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


def _reserve(port: int) -> bool:
    """Marks ``port`` handed out, for every process of this user; False if it already is."""
    RESERVATIONS.mkdir(mode=0o700, exist_ok=True)
    mark = RESERVATIONS / str(port)
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        try:
            if time.time() - mark.stat().st_mtime < RESERVE_S:
                return False
            os.utime(mark)  # an old reservation: its port was bound and let go long since
            return True
        except FileNotFoundError:
            return _reserve(port)  # removed meanwhile


# Serve's direct-ingress port ranges for replicas (Ray's defaults), cut into windows: each owner
# takes one whose ports are all free, chosen at random, so concurrent Serves do not share ports.
REPLICA_PORT_RANGES = {"GRPC": (40000, 41000), "HTTP": (30000, 31000)}
REPLICA_WINDOW = 16


def free_replica_window() -> int:
    """A window index whose gRPC and HTTP replica ports are all bindable now (-1: none found)."""
    windows = (REPLICA_PORT_RANGES["GRPC"][1] - REPLICA_PORT_RANGES["GRPC"][0]) // REPLICA_WINDOW
    for window in random.Random(os.getpid() ^ time.monotonic_ns()).sample(range(windows), windows):
        ports = [low + window * REPLICA_WINDOW + i for low, _ in REPLICA_PORT_RANGES.values() for i in range(REPLICA_WINDOW)]
        if all(_bindable(port, "127.0.0.1") and _bindable(port, "0.0.0.0") for port in ports):
            return window
    return -1


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _process_started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def haproxy_processes(directory: Path) -> list[psutil.Process]:
    """The HAProxy processes started with ``-f <a config file under directory>`` (Ray writes it
    to ``<directory>/<node id>/haproxy.cfg``)."""
    prefix = str(directory) + os.sep
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        configs = [cmdline[n + 1] for n, arg in enumerate(cmdline[:-1]) if arg == "-f"]
        if cmdline and cmdline[0].endswith("haproxy") and any(c.startswith(prefix) and c.endswith(CONFIG_FILE) for c in configs):
            found.append(proc)
    return found


def owner_processes(directory: Path) -> list[psutil.Process]:
    """The processes started with the owner at ``directory``'s settings in their environment: the
    local Ray instance its serve started (GCS, raylet, workers, and the proxy actor that respawns
    HAProxy) and that instance's HAProxy."""
    config = str(directory / CONFIG_FILE)
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(CONFIG_VARIABLE) == config:
                found.append(proc)
        except psutil.Error:  # gone, a zombie, or another user's
            continue
    return found


def end_processes(processes: list[psutil.Process], timeout_s: float = 3.0) -> None:
    for proc in processes:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout_s)


def stop_haproxy(directory: Path, settle_s: float = 1.0, timeout_s: float = 10.0) -> int:
    """Ends every HAProxy of the owner at ``directory``; returns how many were ended.

    Looks again until none has appeared for ``settle_s``: a proxy actor still alive for a
    moment after its driver died may respawn one."""
    ended, quiet_since = 0, time.monotonic()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() - quiet_since < settle_s and time.monotonic() < deadline:
        found = haproxy_processes(directory)
        if found:
            end_processes(found)
            ended += len(found)
            quiet_since = time.monotonic()
        else:
            time.sleep(0.1)
    return ended


def reap_orphans(root: Path | None = None) -> list[dict]:
    """Ends the HAProxy, and the local Ray, of every owner under ``root`` whose process is gone;
    returns their states."""
    root = root or state_root()
    reaped = []
    for state_file in sorted(root.glob(f"*/{STATE_FILE}")):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        started = _process_started(state["owner_pid"])
        if started is not None and abs(started - state["owner_started"]) < 1.0:
            continue  # a live owner (same pid, same start time): its HAProxy is its own business
        # Its Ray first: a SIGKILLed serve's local Ray outlives it for a while, and its proxy
        # actor starts a new HAProxy on the serve's port when the old one is ended.
        end_processes(owner_processes(state_file.parent))
        state["ended"] = stop_haproxy(state_file.parent, settle_s=0.5)
        shutil.rmtree(state_file.parent, ignore_errors=True)
        reaped.append(state)
    return reaped


def _wrapper_script(real_binary: str, ports: tuple[int, int]) -> str:
    from edgespec.cloud.serving.tls import WRAPPER_MARK

    alternatives = "|".join(str(p) for p in ports)
    return f"""#!/bin/sh
# Serve's HAProxy with its stats and metrics listeners on loopback ({WRAPPER_MARK}).
prev=""
for arg in "$@"; do
  if [ "$prev" = "-f" ]; then sed -i -E 's/^( *bind )\\*?:({alternatives})$/\\1127.0.0.1:\\2/' "$arg"; fi
  prev="$arg"
done
exec {real_binary} "$@"
"""


@dataclass
class HAProxyOwner:
    directory: Path
    stats_port: int
    metrics_port: int
    expose_stats: bool = False
    fallback_grpc_port: int = 0  # 0: Ray's default
    fallback_http_port: int = 0
    replica_window: int = -1  # which REPLICA_WINDOW-port slice of Serve's replica port ranges; -1: Ray's whole ranges

    @classmethod
    def claim(cls, *, stats_port: int | None = None, metrics_port: int | None = None, expose_stats: bool = False,
              root: Path | None = None, avoid: Iterable[int | None] = ()) -> "HAProxyOwner":
        """Reaps orphaned HAProxies, then takes a state directory and two ports for this process.

        ``avoid``: ports this process will listen on later (the serve's own gRPC and HTTP
        ingress): free now, so a port chosen here could otherwise be one of them."""
        root = root or state_root()
        reap_orphans(root)
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        taken = {port for port in avoid if port}
        stats_port = stats_port or free_port(avoid=taken)
        taken.add(stats_port)
        metrics_port = metrics_port or free_port(avoid=taken)
        if stats_port == metrics_port:
            raise ValueError(f"the HAProxy stats and metrics ports must differ (both {stats_port})")
        directory = root / secrets.token_hex(4)
        longest = len(f"{directory}/{'0' * 56}/metrics.sock")  # Ray adds a 56-hex node id
        if longest > SOCKET_PATH_MAX:
            raise ValueError(f"HAProxy state directory {directory} is too long: its socket paths would be {longest} "
                             f"characters, HAProxy takes {SOCKET_PATH_MAX} (set EDGESPEC_STATE_DIR to a shorter path)")
        directory.mkdir(mode=0o700)
        taken.add(metrics_port)
        fallback_grpc_port = free_port(avoid=taken)
        fallback_http_port = free_port(avoid=taken | {fallback_grpc_port})
        owner = cls(directory, stats_port, metrics_port, expose_stats, fallback_grpc_port, fallback_http_port,
                    free_replica_window())
        if not expose_stats:
            from edgespec.cloud.serving.tls import haproxy_binary

            wrapper = directory / "haproxy"
            wrapper.write_text(_wrapper_script(haproxy_binary(), (stats_port, metrics_port)))
            wrapper.chmod(0o700)
        owner._write_state()
        return owner

    @property
    def config_file(self) -> Path:
        return self.directory / CONFIG_FILE

    def environment(self) -> dict[str, str]:
        """What every Ray process this owner starts needs in its environment (read at import)."""
        env = {
            "RAY_SERVE_HAPROXY_STATS_PORT": str(self.stats_port),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(self.metrics_port),
            CONFIG_VARIABLE: str(self.config_file),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(self.directory / "admin.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(self.directory),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(self.directory / "server-state"),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(self.directory / "metrics.sock"),
        }
        if self.fallback_grpc_port:
            env["RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"] = str(self.fallback_grpc_port)
        if self.fallback_http_port:
            env["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"] = str(self.fallback_http_port)
        if self.replica_window >= 0:
            for kind, (low, _) in REPLICA_PORT_RANGES.items():
                start = low + self.replica_window * REPLICA_WINDOW
                env[f"RAY_SERVE_DIRECT_INGRESS_MIN_{kind}_PORT"] = str(start)
                env[f"RAY_SERVE_DIRECT_INGRESS_MAX_{kind}_PORT"] = str(start + REPLICA_WINDOW - 1)
        if not self.expose_stats:
            env["RAY_SERVE_HAPROXY_BINARY_PATH"] = str(self.directory / "haproxy")
        return env

    def processes(self) -> list[psutil.Process]:
        return haproxy_processes(self.directory)

    def record_running(self) -> list[int]:
        """Notes the running HAProxy pids in the state file (for people; reaping goes by identity)."""
        pids = [proc.pid for proc in self.processes()]
        self._write_state(haproxy_pids=pids)
        return pids

    def stop(self) -> int:
        """Ends this owner's HAProxy (call after Ray is down, or the proxy actor respawns it) and
        takes its settings out of this process's environment."""
        ended = stop_haproxy(self.directory, settle_s=0.3)
        shutil.rmtree(self.directory, ignore_errors=True)
        for name, value in self.environment().items():
            if os.environ.get(name) == value:
                del os.environ[name]
        return ended

    def _write_state(self, **extra) -> None:
        state = {"owner_pid": os.getpid(), "owner_started": _process_started(os.getpid()),
                 "stats_port": self.stats_port, "metrics_port": self.metrics_port,
                 "directory": str(self.directory), **extra}
        tmp = self.directory / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.directory / STATE_FILE)
