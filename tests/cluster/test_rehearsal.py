"""cluster/ray-cluster.yaml's own commands run: `scripts/rehearse_ray_up.sh --dry` executes every
setup and start command in a throwaway home (pip --dry-run, so the wheel's glob and extra must
resolve; the TLS config is checked by haproxy; Ray is not started: the full rehearsal does that,
see scripts/rehearse_ray_up.py). ~10 s. And every path the commands and serve.yaml name is one
the file mounts fill."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml
from helpers import REPO

MOUNT_ROOT = "/home/ubuntu/edgespec"


def test_the_clusters_own_commands_run_in_a_throwaway_home():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "rehearse_ray_up.py"), "--dry"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "every command ran" in done.stdout
    for section in ("setup_commands", "head_setup_commands", "head_start_ray_commands", "worker_start_ray_commands"):
        assert f"[{section}] ok" in done.stdout


def test_every_path_the_commands_and_serve_yaml_name_is_mounted():
    cluster = yaml.safe_load((REPO / "cluster" / "ray-cluster.yaml").read_text())
    mounts = cluster["file_mounts"]
    assert all(target.startswith(MOUNT_ROOT + "/") for target in mounts)
    assert cluster["auth"]["ssh_user"] == "ubuntu" and MOUNT_ROOT.startswith("/home/ubuntu/")  # ~ is the mount's home
    text = " ".join(cluster["setup_commands"] + cluster["head_setup_commands"]) + (REPO / "cluster" / "serve.yaml").read_text()
    assert "~/" not in " ".join(cluster["setup_commands"] + cluster["head_setup_commands"])
    named = set(re.findall(re.escape(MOUNT_ROOT) + r"/[\w./*-]+", text))
    assert named
    for path in named:
        mount = next((m for m in mounts if path == m or path.startswith(m + "/")), None)
        assert mount, f"{path} is under no file mount"
        source = REPO / mounts[mount] / path[len(mount) + 1:] if path != mount else REPO / mounts[mount]
        if mounts[mount] not in ("./dist", "./keys", "./tls"):  # built or made by the operator, not in git
            assert list(source.parent.glob(source.name)), f"{path}: {source} does not exist in the checkout"
