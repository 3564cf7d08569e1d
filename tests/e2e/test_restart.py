"""`edgespec serve` owns its HAProxy: a serve SIGKILLed leaves one behind, and the next serve,
started a second later on the same port, ends it and comes up; two serves run side by side; a
SIGTERM ends each within 20 s, with no traceback and no HAProxy left.

One test, three serve processes on the tiny target (~90 s on two loaded cores)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import free_port

from edgespec.cloud.serving.haproxy_owner import haproxy_processes

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 240


class ServeProcess:
    def __init__(self, model: Path, port: int, state_dir: Path, log: Path):
        env = {**os.environ, "EDGESPEC_STATE_DIR": str(state_dir), "PYTHONUNBUFFERED": "1"}
        self.port, self.log = port, log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgespec.cli", "serve", "--model", str(model), "--grpc-port", str(port),
             "--num-cpus", "0.5"],
            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_serving(self) -> Path:
        """The serve's HAProxy state directory, once it says it serves."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            found = re.search(r"its files in (\S+)", self.text())
            if found and "edgespec: serving" in self.text():
                return Path(found.group(1))
            assert self.proc.poll() is None, f"serve on {self.port} exited:\n{self.text()[-3000:]}\n{listeners(self.port)}"
            time.sleep(0.5)
        raise TimeoutError(f"serve on {self.port} not up within {START_TIMEOUT_S}s:\n{self.text()[-3000:]}")

    def stop(self) -> float:
        """SIGTERM; seconds until the process exited."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        return time.monotonic() - started


def listeners(port: int) -> str:
    """Who listens on ``port`` now (a serve that died at start: was its port shared?)."""
    import psutil

    found = []
    for c in psutil.net_connections(kind="tcp"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
            try:
                who = " ".join(psutil.Process(c.pid).cmdline()[:4]) if c.pid else "?"
            except psutil.Error:
                who = "(gone)"
            found.append(f"pid {c.pid}: {who}")
    return f"listening on {port}: {'; '.join(found) or 'nothing'}"


def healthy(port: int) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="edgespec.v1.Speculative"), timeout=10)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_sigkill_then_restart_two_side_by_side_and_sigterm(tiny_pair, tmp_path):
    state_dir = Path(tempfile.mkdtemp(prefix="es", dir="/tmp"))  # short: HAProxy's socket paths are capped at 97 characters
    processes: list[ServeProcess] = []
    try:
        port, other_port = free_port(), free_port()
        first = ServeProcess(tiny_pair.target_dir, port, state_dir, tmp_path / "first.log")
        processes.append(first)
        first_dir = first.wait_serving()
        assert haproxy_processes(first_dir)

        first.proc.kill()  # SIGKILL: nothing of the serve's own shutdown runs; its HAProxy stays behind
        first.proc.wait(timeout=30)
        time.sleep(1.0)
        assert haproxy_processes(first_dir), "the SIGKILLed serve's HAProxy should still hold the port here"
        again = ServeProcess(tiny_pair.target_dir, port, state_dir, tmp_path / "again.log")
        beside = ServeProcess(tiny_pair.target_dir, other_port, state_dir, tmp_path / "beside.log")
        processes += [again, beside]
        again_dir, beside_dir = again.wait_serving(), beside.wait_serving()
        assert not haproxy_processes(first_dir) and not first_dir.exists()  # reaped by the next start
        assert healthy(port) and healthy(other_port)

        for serve in (again, beside):
            seconds = serve.stop()
            assert seconds <= 20, f"SIGTERM took {seconds:.1f}s"
            assert serve.proc.returncode == 0
            assert "Traceback" not in serve.text() and "SIGTERM received" not in serve.text(), serve.text()[-3000:]
        assert not haproxy_processes(again_dir) and not haproxy_processes(beside_dir)
        assert not list(state_dir.iterdir())
    finally:
        for serve in processes:
            if serve.proc.poll() is None:
                serve.proc.kill()
                serve.proc.wait(timeout=30)
        from edgespec.cloud.serving.haproxy_owner import reap_orphans

        reap_orphans(state_dir)  # whatever a failure left behind
        shutil.rmtree(state_dir, ignore_errors=True)
