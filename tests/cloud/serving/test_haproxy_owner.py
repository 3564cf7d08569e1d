"""haproxy_owner: an owner's ports and files, the loopback rewrite, and reaping by identity
(a fake "haproxy" process: a python named haproxy). No Ray, ~5 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from edgespec.cloud.serving import haproxy_owner
from edgespec.cloud.serving.haproxy_owner import (
    CONFIG_VARIABLE, PORT_RANGE, REPLICA_WINDOW, HAProxyOwner, haproxy_processes, reap_orphans)


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="est", dir="/tmp"))  # short, as HAProxy's socket paths need
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def fake_haproxy(directory: Path, tmp: Path) -> subprocess.Popen:
    """A process whose command line is `.../haproxy ... -f <directory>/<node>/haproxy.cfg`."""
    binary = tmp / "haproxy"
    if not binary.exists():
        binary.symlink_to(sys.executable)
    return subprocess.Popen([str(binary), "-c", "import time; time.sleep(120)", "-f", str(directory / "node" / "haproxy.cfg")])


def test_an_owner_has_its_own_files_and_two_free_ports_outside_rays_ranges(root):
    owner = HAProxyOwner.claim(root=root)
    env = owner.environment()
    assert PORT_RANGE[0] <= owner.stats_port <= PORT_RANGE[1] and PORT_RANGE[0] <= owner.metrics_port <= PORT_RANGE[1]
    assert owner.stats_port != owner.metrics_port
    assert env["RAY_SERVE_HAPROXY_STATS_PORT"] == str(owner.stats_port)
    # Serve's fallback proxy ports too: Ray's fixed 9500 / 8500 are shared (SO_REUSEPORT) by every
    # Serve on the machine, which then answer each other's clients.
    fallback = {owner.fallback_grpc_port, owner.fallback_http_port}
    assert len(fallback | {owner.stats_port, owner.metrics_port}) == 4 and not fallback & {9500, 8500}
    assert env["RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"] == str(owner.fallback_grpc_port)
    assert env["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"] == str(owner.fallback_http_port)
    low, high = int(env["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"]), int(env["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"])
    assert 40000 <= low < high <= 41000 and high - low + 1 == REPLICA_WINDOW
    assert int(env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) - int(env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]) == REPLICA_WINDOW - 1
    assert all(env[name].startswith(str(owner.directory)) for name in env if name.endswith(("_LOC", "_PATH", "_BASE", "_FILE")))
    state = json.loads((owner.directory / "owner.json").read_text())
    assert state["owner_pid"] == os.getpid()
    other = HAProxyOwner.claim(root=root)  # a second server on the machine: nothing shared
    assert other.directory != owner.directory and {other.stats_port, other.metrics_port}.isdisjoint(
        {owner.stats_port, owner.metrics_port})
    owner.stop()
    other.stop()
    assert not owner.directory.exists()


def test_an_owner_never_takes_the_ports_its_serve_will_listen_on(root, monkeypatch, tmp_path):
    """The serve's own ingress ports are free while the owner is claimed (Serve binds them
    later): a stats port drawn equal to the gRPC port made HAProxy refuse to start ("cannot bind
    socket ... for proxy stats"). Six ports in all, two of them the serve's: the owner's four are
    exactly the other four, wherever the draw starts."""
    low = PORT_RANGE[0]
    monkeypatch.setattr(haproxy_owner, "PORT_RANGE", (low, low + 5))
    monkeypatch.setattr(haproxy_owner, "_bindable", lambda port, host: True)
    for draw in range(8):
        monkeypatch.setattr(haproxy_owner, "_handed_out", set())
        monkeypatch.setattr(haproxy_owner, "RESERVATIONS", tmp_path / f"draw{draw}")
        owner = HAProxyOwner.claim(root=root, avoid=(low + 1, None, low + 4))
        taken = {owner.stats_port, owner.metrics_port, owner.fallback_grpc_port, owner.fallback_http_port}
        owner.stop()
        assert taken == {low, low + 2, low + 3, low + 5}


def test_the_wrapper_binds_stats_and_metrics_on_loopback_only(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text("frontend prometheus\n    bind :9101\nfrontend grpc\n    bind 127.0.0.1:9000 proto h2\n"
                      "listen stats\n  bind *:8404\n  bind *:8405\n")
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(haproxy_owner._wrapper_script("true", (8404, 9101)))
    wrapper.chmod(0o700)
    subprocess.run([str(wrapper), "-db", "-f", str(config)], check=True)
    assert config.read_text() == ("frontend prometheus\n    bind 127.0.0.1:9101\nfrontend grpc\n    bind 127.0.0.1:9000 proto h2\n"
                                  "listen stats\n  bind 127.0.0.1:8404\n  bind *:8405\n")


def test_a_gone_owners_haproxy_is_reaped_and_a_live_ones_is_not(root, tmp_path):
    live = HAProxyOwner.claim(root=root)  # (claim reaps too: the gone owner comes after it)
    gone = root / "gone"
    gone.mkdir()
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    (gone / "owner.json").write_text(json.dumps({"owner_pid": finished.pid, "owner_started": 0.0}))
    orphan, ours = fake_haproxy(gone, tmp_path), fake_haproxy(live.directory, tmp_path)
    try:
        import time

        deadline = time.monotonic() + 10
        while not (haproxy_processes(gone) and haproxy_processes(live.directory)) and time.monotonic() < deadline:
            time.sleep(0.05)
        unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "-f", str(gone / "x" / "haproxy.cfg")])
        reaped = reap_orphans(root)
        assert [state["owner_pid"] for state in reaped] == [finished.pid]
        assert orphan.wait(timeout=10) is not None and not gone.exists()
        assert ours.poll() is None and unrelated.poll() is None  # a live owner's, and one not named haproxy
        unrelated.kill()
        assert live.stop() == 1 and ours.wait(timeout=10) is not None
    finally:
        for proc in (orphan, ours):
            if proc.poll() is None:
                proc.kill()


RESPAWNER = """
import subprocess, sys, time
while True:  # a proxy actor: a new HAProxy a second after the last one ended
    child = subprocess.Popen(sys.argv[1:])
    child.wait()
    time.sleep(1.0)
"""


def test_a_gone_owners_ray_is_ended_before_its_haproxy_so_nothing_respawns_it(root, tmp_path):
    gone = root / "gone"
    gone.mkdir()
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    (gone / "owner.json").write_text(json.dumps({"owner_pid": finished.pid, "owner_started": 0.0}))
    binary = tmp_path / "haproxy"
    binary.symlink_to(sys.executable)
    env = {**os.environ, CONFIG_VARIABLE: str(gone / "haproxy.cfg")}
    proxy_actor = subprocess.Popen([sys.executable, "-c", RESPAWNER, str(binary), "-c", "import time; time.sleep(120)",
                                    "-f", str(gone / "node" / "haproxy.cfg")], env=env)
    try:
        import time

        deadline = time.monotonic() + 10
        while not haproxy_processes(gone) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert haproxy_processes(gone)
        assert [state["owner_pid"] for state in reap_orphans(root)] == [finished.pid]
        assert proxy_actor.wait(timeout=10) is not None
        time.sleep(1.5)  # past the respawner's second
        assert not haproxy_processes(gone)
    finally:
        if proxy_actor.poll() is None:
            proxy_actor.kill()
        for proc in haproxy_processes(gone):
            proc.kill()


def test_a_port_handed_to_one_process_is_not_handed_to_another(monkeypatch, tmp_path):
    """Two processes drawing from the same free ports (two serves started side by side, or a
    test's chosen port and a serve's own draws) never get the same one while it is reserved;
    an old reservation lapses."""
    low = PORT_RANGE[0]
    monkeypatch.setattr(haproxy_owner, "PORT_RANGE", (low, low + 3))
    monkeypatch.setattr(haproxy_owner, "RESERVATIONS", tmp_path / "ports")
    monkeypatch.setattr(haproxy_owner, "_bindable", lambda port, host: True)
    drawn = set()
    for _ in range(4):
        monkeypatch.setattr(haproxy_owner, "_handed_out", set())  # each a process of its own
        drawn.add(haproxy_owner.free_port())
    assert drawn == set(range(low, low + 4))
    monkeypatch.setattr(haproxy_owner, "_handed_out", set())
    with pytest.raises(RuntimeError, match="no free port"):
        haproxy_owner.free_port()
    old = tmp_path / "ports" / str(low + 2)
    os.utime(old, (0, 0))  # reserved long ago
    assert haproxy_owner.free_port() == low + 2
