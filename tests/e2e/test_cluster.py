"""Scale-out on a local fake multi-node cluster that autoscales "GPU" worker nodes (the stand-in
for a GPU cloud, cluster/README.md): `serve deploy` of the cluster's Serve config, sessions
spread over two replicas, a lossless drain from 2 to 1 replicas under load, and Serve's
autoscaling following a ramp of sessions up (replicas and nodes added) and down (removed).
Every generation is checked against the target's own greedy output."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import PROMPTS, REPO, free_port, reference_greedy, wait_for

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

NEW_TOKENS = 40
# The drain test's generations: long enough that sessions are still running on the replica Serve
# stops (with 40 tokens, Serve's router could stop sending it sessions and the ones there could
# all finish before its graceful shutdown began: nothing left to move).
DRAIN_TOKENS = 240
MAX_SESSIONS = 4  # per replica: small, so a handful of devices is "several replicas' worth"
CLUSTER_ID_VARIABLE = "EDGESPEC_TEST_FAKE_CLUSTER"


class FakeCluster:
    def __init__(self, tmp_path: Path, target_dir: Path):
        self.tmp_path, self.target_dir = tmp_path, target_dir
        self.env = {
            **os.environ, "RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
            # Serve's proxy ingress: the fake nodes share this host, and HAProxy mode's per-node
            # port allocation hands every node's first replica the same port (40000), so HAProxy
            # would see one replica (cluster/README.md).
            "RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
            # Rehearsal speed: replicas report their ongoing requests every second, so the
            # autoscaler reacts in seconds rather than tens of seconds.
            "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1",
            # ...and the cluster autoscaler looks every second, not every 5 s, when it adds and
            # removes "GPU" nodes.
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        }
        self.gcs, self.dashboard, self.grpc_port = free_port(), free_port(), free_port()
        self.cluster_id = f"{os.getpid()}-{self.gcs}"
        self.env[CLUSTER_ID_VARIABLE] = self.cluster_id  # inherited by every process of this cluster
        self.http_port = free_port()
        cluster = yaml.safe_load((REPO / "cluster" / "fake-cluster.yaml").read_text())
        cluster["provider"]["gcs_address"] = f"127.0.0.1:{self.gcs}"  # fake workers join this head
        cluster["idle_timeout_minutes"] = 0.1  # idle "GPU" nodes go after 6 s, not a minute
        self.cluster_file = tmp_path / "fake-cluster.yaml"
        self.cluster_file.write_text(yaml.safe_dump(cluster))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def run(self, tool: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=timeout, env=self.env)

    def start(self) -> None:
        started = self.run("ray", "start", "--head", "--num-cpus", "1", f"--port={self.gcs}",
                           f"--dashboard-port={self.dashboard}", f"--autoscaling-config={self.cluster_file}")
        assert started.returncode == 0, started.stderr[-2000:]

    def stop(self) -> None:
        """This cluster's processes only (``ray stop`` would end every Ray on the machine, the
        test process's own and other users' included): each one it started (GCS, raylets,
        dashboard, their agents and monitors, workers, the HAProxy Serve spawned) inherited
        CLUSTER_ID_VARIABLE. Matching command lines missed the autoscaler's monitor and the
        agents, which then ran on, polling, through the rest of the suite."""
        import psutil

        from edgespec.cloud.serving.haproxy_owner import end_processes

        doomed = []
        for process in psutil.process_iter():
            try:
                if process.pid != os.getpid() and process.environ().get(CLUSTER_ID_VARIABLE) == self.cluster_id:
                    doomed.append(process)
            except psutil.Error:
                pass
        end_processes(doomed)

    def deploy(self, deployment: dict | None = None, **args) -> None:
        """`serve deploy` of cluster/serve-fake-gpu.yaml with the tiny target and ``args`` over its
        own; ``deployment``: Serve's per-deployment overrides (``num_replicas`` there is a
        lightweight update: replicas are added or removed, the others keep running)."""
        config = yaml.safe_load((REPO / "cluster" / "serve-fake-gpu.yaml").read_text())
        config["grpc_options"]["port"] = self.grpc_port
        config["http_options"]["port"] = self.http_port
        app_args = config["applications"][0]["args"]
        app_args.update(model=str(self.target_dir), max_sessions=MAX_SESSIONS, max_batch_size=MAX_SESSIONS)
        for name, value in args.items():
            if value is None:
                app_args.pop(name, None)
            else:
                app_args[name] = value
        if deployment:
            config["applications"][0]["deployments"] = [{"name": "Verifier", **deployment}]
        rendered = self.tmp_path / "serve.yaml"
        rendered.write_text(yaml.safe_dump(config))
        deploy = self.run("serve", "deploy", "-a", f"http://127.0.0.1:{self.dashboard}", str(rendered), timeout=120)
        assert deploy.returncode == 0, deploy.stderr[-2000:]

    def serve_status(self) -> str:
        return self.run("serve", "status", "-a", f"http://127.0.0.1:{self.dashboard}", timeout=60).stdout

    def replicas(self) -> dict[str, int]:
        """The verifier's replicas by state (RUNNING, STARTING, STOPPING, ...), from Serve's REST API."""
        import json
        import urllib.request

        url = f"http://127.0.0.1:{self.dashboard}/api/serve/applications/"
        with urllib.request.urlopen(url, timeout=30) as reply:
            details = json.load(reply)
        app = (details.get("applications") or {}).get("edgespec") or {}
        replicas = ((app.get("deployments") or {}).get("Verifier") or {}).get("replicas") or []
        return dict(collections.Counter(replica["state"] for replica in replicas))

    def gpu_nodes(self) -> int:
        """GPUs the cluster has right now (one per fake worker node), from Ray's state API (the
        ``ray status`` CLI took seconds a call, and the ramp samples every few)."""
        import json
        import urllib.request

        url = f"http://127.0.0.1:{self.dashboard}/api/v0/nodes?limit=1000&detail=1"
        with urllib.request.urlopen(url, timeout=30) as reply:
            nodes = json.load(reply)["data"]["result"]["result"]
        return round(sum((node.get("resources_total") or {}).get("GPU", 0) for node in nodes if node.get("state") == "ALIVE"))

    def answering_replicas(self, calls: int = 8) -> set[str]:
        """The replicas that answer Info through the ingress (HAProxy adds a new one within seconds)."""
        import grpc

        from edgespec.v1 import speculative_pb2 as pb
        from edgespec.v1 import speculative_pb2_grpc as pb_grpc

        seen = set()
        for _ in range(calls):
            with grpc.insecure_channel(self.address) as channel:
                try:
                    seen.add(pb_grpc.SpeculativeStub(channel).Info(pb.InfoRequest(), timeout=5).replica_id)
                except grpc.RpcError:
                    pass
        return seen - {""}

    def wait_for(self, what: str, condition, timeout_s: float, interval_s: float = 1.0):
        return wait_for(what, condition, timeout_s, interval_s, detail=lambda: f"serve status:\n{self.serve_status()}")


@pytest.fixture(scope="module")
def cluster(tiny_pair, tmp_path_factory):
    fake = FakeCluster(tmp_path_factory.mktemp("fake-cluster"), tiny_pair.target_dir)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()  # the HAProxy as well: left behind, it would hold the ports the next Serve's HAProxy binds


def _references(tiny_pair, target_model, new_tokens: int):
    from edgespec.edge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_pair.draft_dir)
    prompts = [tokenizer.encode(text).ids for text in PROMPTS[:6]]
    return prompts, [reference_greedy(target_model, ids, new_tokens) for ids in prompts]


@pytest.fixture(scope="module")
def references(tiny_pair, target_model):
    return _references(tiny_pair, target_model, NEW_TOKENS)


@pytest.fixture(scope="module")
def long_references(tiny_pair, target_model):
    return _references(tiny_pair, target_model, DRAIN_TOKENS)


def fleet(cluster, tiny_pair, references, **options):
    from edgespec.cloud.bench.fleet import Fleet

    prompts, expected = references
    return Fleet(cluster.address, tiny_pair.draft_dir, prompts, max_new_tokens=len(expected[0]), k=3,
                 stop_token_ids=(), **options)


def assert_exact(devices, references) -> None:
    _, expected = references
    assert not devices.errors, devices.errors
    assert devices.results
    for item in devices.results:
        assert item.result.token_ids == expected[item.prompt], (item.device, item.prompt, item.result.stats.summary())


def two_replicas(cluster) -> None:
    cluster.deploy(num_replicas=2)
    cluster.wait_for("2 replicas RUNNING", lambda: cluster.replicas() == {"RUNNING": 2}, 240)
    cluster.wait_for("the ingress routing to both replicas", lambda: len(cluster.answering_replicas()) == 2, 60)


def test_serve_deploy_spreads_sessions_over_two_gpu_replicas(cluster, tiny_pair, references):
    two_replicas(cluster)
    # Two replicas asking for a GPU each: the autoscaler had to add a second GPU worker.
    assert cluster.gpu_nodes() == 2
    with fleet(cluster, tiny_pair, references) as devices:
        devices.resize(2 * MAX_SESSIONS)
        cluster.wait_for("a generation per device", lambda: len(devices.results) >= 4 * MAX_SESSIONS, 120, 0.2)
        devices.stop()
    assert_exact(devices, references)
    per_replica = collections.Counter(r for item in devices.results for r in item.result.stats.replica_ids)
    print("sessions per replica:", dict(per_replica))
    assert len(per_replica) == 2, per_replica
    assert min(per_replica.values()) >= 0.25 * sum(per_replica.values()), per_replica  # leastconn spreads them


def test_drain_two_to_one_replica_loses_no_token(cluster, tiny_pair, long_references):
    """Scaling 2 -> 1 mid-generation: the stopped replica's sessions move (Verdict.draining),
    reopen elsewhere with their committed tokens, and finish exactly; outage < 1 s each."""
    references = long_references
    two_replicas(cluster)
    with fleet(cluster, tiny_pair, references, cloud_only_devices=1) as devices:
        # As many devices as the replica that stays can hold (a full replica refuses the rest
        # with RESOURCE_EXHAUSTED and they back off: capacity, not the drain, would then decide).
        devices.resize(MAX_SESSIONS)
        cluster.wait_for("every device generating", lambda: len({i.device for i in devices.results}) >= MAX_SESSIONS, 120, 0.2)
        cluster.deploy(num_replicas=2, deployment={"num_replicas": 1})  # scale down; the app is unchanged
        moved = cluster.wait_for("sessions moved", lambda: sum(i.result.stats.moves for i in devices.results), 60, 0.5)
        cluster.wait_for("1 replica left", lambda: cluster.replicas() == {"RUNNING": 1}, 90)
        time.sleep(2)  # generations go on on the remaining replica
        devices.stop()
    assert_exact(devices, references)
    outages = [s for item in devices.results for s in item.result.stats.move_outages_s]
    resumes = sum(item.result.stats.resumes for item in devices.results)
    print(f"moved {moved} session(s); outages ms: {[round(s * 1000) for s in outages]}; resumes after a failure: {resumes}")
    assert outages and max(outages) < 1.0, outages


def test_autoscaling_follows_a_ramp_of_sessions(cluster, tiny_pair, references):
    """Serve's autoscaling_config on ongoing sessions: a ramp to several replicas' worth of
    sessions adds replicas and "GPU" nodes; when the load stops they go away again."""
    # One ongoing request per replica as the target: the one replica at first holds MAX_SESSIONS
    # sessions (it refuses the rest), which already asks for all 3, so the "GPU" nodes for two
    # are launched together. With 2 as the target it asked for 2, then for 3 once the second
    # was up: one node after the other, ~20 s more.
    cluster.deploy(num_replicas=None, autoscaling_config={
        "min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 1,
        "upscale_delay_s": 1, "downscale_delay_s": 4, "look_back_period_s": 2,
    })
    cluster.wait_for("autoscaling deployed", lambda: cluster.replicas().get("RUNNING") == 1 and len(cluster.replicas()) == 1, 120)
    timeline = []

    def sample(load: int) -> tuple[int, int]:
        replicas, nodes = cluster.replicas().get("RUNNING", 0), cluster.gpu_nodes()
        timeline.append((round(time.monotonic() - start), load, replicas, nodes))
        return replicas, nodes

    start = time.monotonic()
    with fleet(cluster, tiny_pair, references) as devices:
        # 2 replicas' worth of sessions is 8 replicas' worth of the autoscaler's target: enough
        # for the 3 it may have (a ramp to 3 replicas' worth, 12 devices, only added CPU load
        # for the replicas it had to share).
        for load in (1, MAX_SESSIONS, 2 * MAX_SESSIONS):
            devices.resize(load)
            sample(load)
            time.sleep(2)
        cluster.wait_for("3 replicas for the peak", lambda: sample(devices.size)[0] == 3, 180)
        print("t_s at the peak:", round(time.monotonic() - start))
        devices.stop()
        print("t_s devices stopped:", round(time.monotonic() - start))
    assert_exact(devices, references)
    cluster.wait_for("back to 1 replica and 1 GPU node", lambda: sample(0) == (1, 1) and cluster.replicas() == {"RUNNING": 1}, 180, 2)
    print("t_s, devices, replicas, gpu_nodes:", timeline)
    assert max(nodes for *_, nodes in timeline) == 3
