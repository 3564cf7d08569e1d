"""A replica count changed in the Serve config's `deployments:` override (what cluster/serve.yaml
and `edgespec serve --print-config` use) is a lightweight update: Serve adds a replica and
leaves the one running, and a session streaming through it, alone.

One test, one Ray instance, the tiny target: ~60 s on two loaded cores."""

from __future__ import annotations

import time

import pytest
from helpers import PROMPTS, SERVE_START_TIMEOUT_S, free_port

from edgespec.edge.client import EdgeClient

pytestmark = pytest.mark.slow


def replica_actors() -> set[str]:
    import ray

    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "#Verifier#" in a["name"]}


def deploy(config: dict) -> None:
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))  # what `serve deploy` sends


def test_a_num_replicas_change_in_the_override_keeps_the_replica_and_its_session(tiny_pair):
    from ray import serve

    from edgespec.cloud.serving.app import (
        APP_NAME, grpc_options, init_ray, serve_config, stop_serving, wait_until_running, wait_until_serving)
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig

    init_ray(num_cpus=4)
    try:
        port, http_port = free_port(), free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": http_port}, grpc_options=grpc_options(port))
        verifier = VerifierConfig(model=str(tiny_pair.target_dir), device="cpu", session_idle_timeout_s=600)
        one = serve_config(verifier, DeploymentOptions(num_replicas=1, num_cpus=0.5), grpc_port=port, http_port=http_port)
        deploy(one)
        wait_until_running(APP_NAME, timeout_s=SERVE_START_TIMEOUT_S, progress=print)
        wait_until_serving(f"127.0.0.1:{port}", timeout_s=60)
        (first,) = replica_actors()

        with EdgeClient(f"127.0.0.1:{port}", tiny_pair.draft_dir) as client:
            stream = client.stream(PROMPTS[0], max_new_tokens=48, k=3, stop_token_ids=())
            next(stream)  # the session is open on the one replica
            two = serve_config(verifier, DeploymentOptions(num_replicas=2, num_cpus=0.5), grpc_port=port,
                               http_port=http_port)
            assert two["applications"][0]["args"] == one["applications"][0]["args"]  # only the override changed
            deploy(two)
            deadline = time.monotonic() + SERVE_START_TIMEOUT_S
            while len(replica_actors()) < 2 or not str(serve.status().applications[APP_NAME].status).endswith("RUNNING"):
                assert time.monotonic() < deadline, "the second replica did not start"
                time.sleep(0.5)
            assert first in replica_actors()  # the running replica was kept, not replaced
            for _ in stream:
                pass
            result = stream.result
        assert result is not None and len(result.token_ids) == 48
        assert result.stats.resumes == 0 and len(set(result.stats.replica_ids)) == 1  # never moved
        assert first in replica_actors() and len(replica_actors()) == 2
    finally:
        stop_serving()
