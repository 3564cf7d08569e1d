"""Where Ray places a target split over GPUs, rehearsed on a fake cluster of 8-GPU nodes (the
worker type of cluster/ray-cluster-70b.yaml, its resources as written there): Serve deploys a
stand-in with the deployment options of cluster/serve-70b*.yaml (the placement group that
``gpu_placement`` writes: one bundle per GPU, the replica's CPUs in the first), and the stand-in
does with its group what the vLLM verifier does: it finds the group it runs in (what vLLM's
engine config captures inside a Ray actor) and starts one GPU worker in each GPU bundle, as
vLLM's Ray executor does. No vLLM, no GPU: the fake nodes' GPUs are Ray resources.

Shown: TP 8 fills one node; two TP-4 replicas share the other; TP 16 (larger than any node)
stays pending, judged infeasible, with nothing reserved; TP 8 x PP 2 takes 8 + 8 on the two
nodes; and a PACK group on partly used nodes may split a tensor-parallel group across nodes.
One Ray start (a head and two fake nodes) for the module."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, free_port, wait_for

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
WORKER_TYPE = "ray.worker.8xh100"
CLUSTER_ID_VARIABLE = "EDGESPEC_TEST_PLACEMENT_CLUSTER"
NAMESPACE = "edgespec-placement"


class FakeGpuCluster:
    """A fake multi-node Ray cluster (cluster/README.md, "Rehearsing locally") whose workers have
    the resources of ray-cluster-70b.yaml's GPU worker type, two of them."""

    def __init__(self, tmp_path: Path):
        self.gcs = free_port()
        self.cluster_id = f"{os.getpid()}-{self.gcs}"
        self.env = {
            **os.environ, "RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",  # the fake autoscaler looks every second, not every 5 s
            CLUSTER_ID_VARIABLE: self.cluster_id,  # inherited by every process of this cluster (stop())
        }
        real = yaml.safe_load((REPO / "cluster" / "ray-cluster-70b.yaml").read_text())
        self.node_resources = real["available_node_types"][WORKER_TYPE]["resources"]
        fake = yaml.safe_load((REPO / "cluster" / "fake-cluster.yaml").read_text())
        fake["provider"]["gcs_address"] = f"127.0.0.1:{self.gcs}"
        fake["max_workers"] = 2
        fake["idle_timeout_minutes"] = 10  # no node goes while the module runs
        fake["available_node_types"] = {
            "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
            WORKER_TYPE: {"resources": dict(self.node_resources), "node_config": {}, "min_workers": 2, "max_workers": 2},
        }
        self.cluster_file = tmp_path / "fake-70b-cluster.yaml"
        self.cluster_file.write_text(yaml.safe_dump(fake))

    def start(self) -> None:
        started = subprocess.run(
            [str(BIN / "ray"), "start", "--head", "--num-cpus", "1", f"--port={self.gcs}", "--include-dashboard=false",
             f"--autoscaling-config={self.cluster_file}"],
            capture_output=True, text=True, timeout=180, env=self.env)
        assert started.returncode == 0, started.stderr[-2000:]

    def stop(self) -> None:
        """This cluster's processes only, found by the variable they inherited (``ray stop`` would
        end every Ray on the machine). The environment is read from /proc directly: a Ray agent
        that set its process title (``ray::DashboardAgent``) shows psutil an empty one (the block
        starts with NULs, where psutil stops), and such agents were left running."""
        import psutil

        from edgespec.cloud.serving.haproxy_owner import end_processes

        mark = f"{CLUSTER_ID_VARIABLE}={self.cluster_id}".encode()
        for _ in range(3):
            doomed = []
            for process in psutil.process_iter():
                try:
                    if process.pid != os.getpid() and mark in Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0"):
                        doomed.append(process)
                except (OSError, psutil.Error):
                    pass
            if not doomed:
                return
            end_processes(doomed)


def gpu_nodes() -> dict[str, float]:
    import ray

    return {node["NodeID"]: node["Resources"].get("GPU", 0) for node in ray.nodes()
            if node["Alive"] and node["Resources"].get("GPU")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import ray
    from ray import serve

    fake = FakeGpuCluster(tmp_path_factory.mktemp("placement"))
    fake.start()
    try:
        ray.init(address=f"127.0.0.1:{fake.gcs}", namespace=NAMESPACE, log_to_driver=False)
        wait_for("two fake 8-GPU nodes", lambda: len(gpu_nodes()) == 2, 90)
        serve.start(proxy_location="Disabled")  # handles only: no ingress needed to ask a replica
        yield fake
    finally:
        try:
            ray.shutdown()
        finally:
            fake.stop()


def stand_in() -> Any:
    """A deployment class that does with its placement group what the vLLM verifier does; built
    in a function, so Serve pickles it by value (the replicas cannot import this test module)."""
    from ray import serve

    @serve.deployment
    class StandIn:
        def __init__(self):
            from ray.util import get_current_placement_group

            # What vLLM's AsyncEngineArgs.create_engine_config captures inside a Ray actor and hands
            # to its engine process (vllm/engine/arg_utils.py): the replica's own group.
            self.group = get_current_placement_group()

        def where(self) -> dict:
            import ray
            from ray.util.placement_group import placement_group_table
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            @ray.remote(num_cpus=0, num_gpus=1)
            def worker():
                return ray.get_runtime_context().get_node_id(), [str(gpu) for gpu in ray.get_gpu_ids()]

            node = ray.get_runtime_context().get_node_id()
            if self.group is None:
                return {"replica_node": node, "group": None}
            table = placement_group_table(self.group)
            # vLLM's RayDistributedExecutor: the first world_size bundles that hold a GPU, a worker
            # in each (num_cpus 0, num_gpus 1); one at a time here, to start fewer worker processes.
            workers = []
            for index, bundle in enumerate(self.group.bundle_specs):
                if bundle.get("GPU"):
                    strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index)
                    workers.append(ray.get(worker.options(scheduling_strategy=strategy).remote(), timeout=60))
            count = len(table["bundles"])
            return {"replica_node": node, "group": self.group.id.hex(), "strategy": table["strategy"],
                    "bundles": [table["bundles"][index] for index in range(count)],
                    "bundle_nodes": [table["bundles_to_node_id"][index] for index in range(count)], "workers": workers}

    return StandIn


def override_options(override: dict, num_replicas: int = 1) -> dict:
    """A `serve deploy` config's `deployments:` entry as ``.options()`` arguments, with a fixed
    replica count in place of autoscaling (there is no load to scale on) and no drain wait (no
    sessions to move; a replica still waiting for its group would hold its deletion for it)."""
    options = {key: value for key, value in override.items() if key not in ("name", "autoscaling_config", "num_replicas")}
    return {**options, "num_replicas": num_replicas, "graceful_shutdown_timeout_s": 0}


def file_override(name: str) -> dict:
    (app,) = yaml.safe_load((REPO / "cluster" / name).read_text())["applications"]
    (override,) = app["deployments"]
    return override


def generated_override(tmp_path: Path, **settings) -> dict:
    """What edgespec writes under `deployments:` for these VerifierConfig settings (8 CPUs a replica)."""
    from edgespec.cloud.serving.app import deployment_override
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig

    (tmp_path / "config.json").write_text("{}")
    config = VerifierConfig.from_dict({"model": str(tmp_path), "backend": "vllm", **settings})
    return deployment_override(config, DeploymentOptions(num_cpus=8))


def deploy(name: str, override: dict, num_replicas: int = 1):
    from ray import serve
    from ray.serve.api import _run

    app = stand_in().options(**override_options(override, num_replicas)).bind()
    return _run(app, name=name, route_prefix=None, _blocking=False)


def replica_states(name: str) -> dict[str, int]:
    from ray import serve

    app = serve.status().applications.get(name)
    if app is None:
        return {}
    return {str(getattr(state, "value", state)): count for deployment in app.deployments.values()
            for state, count in deployment.replica_states.items()}


def running(name: str, replicas: int, timeout_s: float) -> None:
    from ray import serve

    wait_for(f"{name}: {replicas} replica(s) running",
             lambda: (serve.status().applications.get(name) is not None
                      and serve.status().applications[name].status == "RUNNING"
                      and replica_states(name).get("RUNNING") == replicas), timeout_s)


def ask_every_replica(handle, replicas: int) -> list[dict]:
    """``where`` from each replica (the router spreads calls; ask until every group has answered)."""
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + 60
    while len(seen) < replicas and time.monotonic() < deadline:
        answer = handle.where.remote().result(timeout_s=60)
        seen[answer["group"]] = answer
    assert len(seen) == replicas, f"{len(seen)} of {replicas} replicas answered"
    return list(seen.values())


def serve_groups(app: str) -> list[dict]:
    """The placement groups of ``app``'s replicas (Serve names each after its replica), as the GCS
    has them now."""
    import ray
    from ray.serve._private.common import ReplicaID

    return [group for group in ray.util.placement_group_table().values()
            if ReplicaID.is_full_id_str(group["name"]) and ReplicaID.from_full_id_str(group["name"]).deployment_id.app_name == app
            and group["state"] != "REMOVED"]


@pytest.fixture(autouse=True)
def clean(cluster):
    """Every test starts with the two nodes free: its applications go, and their groups with them."""
    from ray import serve

    yield
    names = list(serve.status().applications)
    for name in names:
        serve.delete(name, _blocking=False)
    wait_for("applications deleted, their groups removed",
             lambda: not serve.status().applications and not any(serve_groups(name) for name in names), 60)


def test_a_tp8_replica_takes_one_whole_node_and_two_tp4_replicas_share_the_other(cluster, tmp_path):
    """serve-70b.yaml: 8 bundles STRICT_PACK on one 8-GPU node, the replica on it, a worker on
    each of the node's 8 GPUs. Then two TP-4 replicas (the H200 layout): the first node is full,
    so both go to the second, 4 + 4, each group on one node."""
    override = file_override("serve-70b.yaml")
    assert override["placement_group_strategy"] == "STRICT_PACK" and len(override["placement_group_bundles"]) == 8
    started = time.monotonic()
    handle = deploy("tp8", override)
    running("tp8", 1, 90)
    (answer,) = ask_every_replica(handle, 1)
    assert answer["strategy"] == "STRICT_PACK"
    assert answer["bundles"][0] == {"CPU": 8.0, "GPU": 1.0} and all(b == {"GPU": 1.0} for b in answer["bundles"][1:])
    (node,) = set(answer["bundle_nodes"])
    assert answer["replica_node"] == node
    assert {worker_node for worker_node, _ in answer["workers"]} == {node}
    assert sorted(gpu for _, (gpu,) in answer["workers"]) == [str(i) for i in range(8)]  # every GPU of the node once
    print(f"TP 8: 8 bundles on node {node[-8:]}, workers on GPUs {[gpu for _, (gpu,) in answer['workers']]} "
          f"({time.monotonic() - started:.0f}s)")

    tp4 = generated_override(tmp_path, tensor_parallel_size=4)
    assert tp4["placement_group_strategy"] == "STRICT_PACK" and len(tp4["placement_group_bundles"]) == 4
    started = time.monotonic()
    handle4 = deploy("tp4", tp4, num_replicas=2)
    running("tp4", 2, 90)
    answers = ask_every_replica(handle4, 2)
    assert len(gpu_nodes()) == 2
    (second,) = set(gpu_nodes()) - {node}
    for replica in answers:
        assert set(replica["bundle_nodes"]) == {second} and replica["replica_node"] == second
        assert {worker_node for worker_node, _ in replica["workers"]} == {second}
    gpus = sorted(gpu for replica in answers for _, (gpu,) in replica["workers"])
    assert gpus == [str(i) for i in range(8)]  # the two replicas hold disjoint halves of the node
    print(f"TP 4 x 2 replicas: both on node {second[-8:]} ({time.monotonic() - started:.0f}s)")


def test_a_group_larger_than_any_node_stays_pending_with_nothing_reserved(cluster, tmp_path):
    """TP 16 (STRICT_PACK, 16 bundles) on nodes of 8 GPUs: never placed, not split over two
    nodes, and none of its GPUs held while it waits. (The autoscaler cannot help: no node type
    has 16 GPUs.)"""
    import ray

    override = generated_override(tmp_path, tensor_parallel_size=16)
    assert override["placement_group_strategy"] == "STRICT_PACK"
    total = sum(gpu_nodes().values())
    deploy("tp16", override)
    # Ray's own verdict on the group (a feasible one is placed within a second or two here).
    (group,) = wait_for("tp16's group judged", lambda: [group for group in serve_groups("tp16")
                                                        if group["stats"]["scheduling_state"] == "INFEASIBLE"], 30)
    assert group["state"] == "PENDING", group
    assert ray.available_resources().get("GPU", 0) == total  # nothing half-reserved
    assert replica_states("tp16").get("RUNNING", 0) == 0
    print(f"TP 16: group {group['state']} ({group['stats']['scheduling_state']}), "
          f"{ray.available_resources().get('GPU', 0):g}/{total:g} GPUs free, replicas {replica_states('tp16')}")


def test_tp8_x_pp2_takes_both_nodes_8_and_8_and_each_tensor_group_stays_in_a_node(cluster):
    """serve-70b-pp.yaml: 16 bundles PACK over two free 8-GPU nodes, 8 on each; ranked as vLLM's
    Ray executor ranks its workers (the replica's node first, then by node), ranks 0-7 and 8-15
    (the two tensor-parallel groups, one per pipeline stage) each sit on one node."""
    override = file_override("serve-70b-pp.yaml")
    assert override["placement_group_strategy"] == "PACK" and len(override["placement_group_bundles"]) == 16
    started = time.monotonic()
    handle = deploy("tp8pp2", override)
    running("tp8pp2", 1, 90)
    (answer,) = ask_every_replica(handle, 1)
    assert answer["strategy"] == "PACK"
    per_node = collections.Counter(answer["bundle_nodes"])
    assert sorted(per_node.values()) == [8, 8], per_node
    assert answer["replica_node"] == answer["bundle_nodes"][0]
    worker_nodes = [node for node, _ in answer["workers"]]
    assert collections.Counter(worker_nodes) == per_node
    ranked = sorted(worker_nodes, key=lambda node: (node != answer["replica_node"], per_node[node], node))
    stages = [set(ranked[:8]), set(ranked[8:])]
    assert all(len(stage) == 1 for stage in stages) and stages[0] != stages[1]
    print(f"TP 8 x PP 2: bundles per node {dict((k[-8:], v) for k, v in per_node.items())} "
          f"({time.monotonic() - started:.0f}s)")


def test_pack_on_partly_used_nodes_can_split_a_tensor_group(cluster, tmp_path):
    """The hazard serve-70b-pp.yaml warns of: PACK puts a group on as few nodes as it can, not on
    node boundaries. With 2 GPUs of one node and 6 of the other taken, a TP 4 x PP 2 group (8
    bundles) is placed 6 + 2 and one of its tensor-parallel groups of 4 spans both nodes."""
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    from edgespec.cloud.serving.app import gpu_placement
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig

    # 2 GPUs taken on one node, 6 on the other.
    taken = placement_group([{"GPU": 2.0}, {"GPU": 6.0}], strategy="STRICT_SPREAD")
    assert taken.wait(timeout_seconds=60)
    (tmp_path / "config.json").write_text("{}")
    config = VerifierConfig.from_dict({"model": str(tmp_path), "backend": "vllm", "tensor_parallel_size": 4,
                                       "pipeline_parallel_size": 2})
    placement = gpu_placement(config, DeploymentOptions(num_cpus=1))
    assert placement["placement_group_strategy"] == "PACK"
    group = placement_group(placement["placement_group_bundles"], strategy=placement["placement_group_strategy"])
    try:
        assert group.wait(timeout_seconds=30), "a PACK group of 8 bundles with 6 + 2 GPUs free was not placed"
        nodes = [placement_group_table(group)["bundles_to_node_id"][index] for index in range(8)]
        per_node = collections.Counter(nodes)
        assert sorted(per_node.values()) == [2, 6]
        # vLLM's ranks: the engine's node (bundle 0's) first, then nodes with fewer workers; ranks
        # 0-3 and 4-7 are the tensor-parallel groups of the two pipeline stages.
        ranked = sorted(nodes, key=lambda node: (node != nodes[0], per_node[node], node))
        spanning = [len(set(ranked[start:start + 4])) > 1 for start in (0, 4)]
        assert spanning.count(True) == 1, ranked
        print(f"TP 4 x PP 2 on 6 + 2 free GPUs: bundles per node {sorted(per_node.values())}, "
              f"tensor groups spanning nodes {spanning}")
    finally:
        remove_placement_group(group)
        remove_placement_group(taken)
