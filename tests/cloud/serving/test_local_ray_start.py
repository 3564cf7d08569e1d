"""A local Ray whose node does not come up in Ray's fixed 30 s, or whose GCS never writes its
port, is started once more, after the failed start's processes are stopped; any other failure
is raised as it is."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from edgespec.cloud.serving import app

STALLED = Exception("The current node timed out during startup. This could happen because some of the raylet "
                    "failed to startup or the GCS has become overloaded.")


NO_GCS = RuntimeError("Timed out waiting for file /tmp/ray/session_2026-12-03_19-00-02_677334_4842/"
                      "gcs_server_port_e714f18e6cabb5bd5c3e6d22fb3122396ee637ade23d2c829294cf1a")


class FakeRay:
    def __init__(self, *outcomes):
        self.outcomes, self.calls = list(outcomes), []

    def init(self, **kwargs):
        self.calls.append(kwargs)
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome


@pytest.fixture
def fake_ray(monkeypatch):
    def install(*outcomes):
        import ray

        fake = FakeRay(*outcomes)
        monkeypatch.setattr(ray, "init", fake.init)
        stopped = []
        monkeypatch.setattr(app, "_stop_failed_local_session", stopped.append)
        return fake, stopped

    return install


def test_a_stalled_node_is_started_once_more_after_its_processes_stop(fake_ray):
    fake, stopped = fake_ray(STALLED, None)
    app._start_local_ray(num_cpus=2)
    assert [call["address"] for call in fake.calls] == ["local", "local"] and fake.calls[1]["num_cpus"] == 2
    assert len(stopped) == 1


def test_a_gcs_that_never_wrote_its_port_is_started_once_more(fake_ray):
    fake, stopped = fake_ray(NO_GCS, None)
    app._start_local_ray()
    assert len(fake.calls) == 2 and len(stopped) == 1


def test_a_second_stall_and_any_other_failure_are_raised(fake_ray):
    fake, stopped = fake_ray(STALLED, STALLED)
    with pytest.raises(Exception, match="timed out during startup"):
        app._start_local_ray()
    assert len(fake.calls) == 2 and len(stopped) == 1
    fake, stopped = fake_ray(ValueError("bad num_cpus"))
    with pytest.raises(ValueError):
        app._start_local_ray()
    assert len(fake.calls) == 1 and not stopped


def test_the_failed_sessions_processes_are_killed_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # where Ray keeps its sessions
    begun = time.time()
    session = f"session_2026-12-03_08-17-32_637199_{os.getpid()}"
    (tmp_path / "ray" / session / "logs").mkdir(parents=True)
    sleeper = "import time; time.sleep(60)"
    failed = subprocess.Popen([sys.executable, "-c", sleeper, f"--log_dir={tmp_path}/ray/{session}/logs"])
    other = subprocess.Popen([sys.executable, "-c", sleeper, "--log_dir=/tmp/ray/session_of_someone_else/logs"])
    try:
        app._stop_failed_local_session(begun)
        assert failed.wait(timeout=10) is not None
        assert other.poll() is None
    finally:
        for process in (failed, other):
            process.kill()
            process.wait()


def test_a_child_forked_for_the_failed_start_that_never_reached_exec_is_killed():
    import multiprocessing

    import psutil

    begun = time.time()
    stuck = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))  # a copy of this process
    stuck.start()
    try:
        app._stop_failed_local_session(begun)
        assert not psutil.pid_exists(stuck.pid)  # ended and reaped (end_processes waits on it)
    finally:
        if psutil.pid_exists(stuck.pid):
            stuck.kill()
