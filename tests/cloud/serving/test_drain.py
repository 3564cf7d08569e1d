"""The drain signal and the deployment's autoscaling options (pure logic; the drain itself runs
on a fake cluster in tests/e2e/test_cluster.py)."""

from __future__ import annotations

import grpc
import pytest

from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig, target_ongoing_requests
from edgespec.cloud.serving.drain import DrainWatch, draining_error, is_draining_error, serve_replica_stopping
from edgespec.edge.errors import DRAINING_MESSAGE
from edgespec.edge.transport import is_draining_refusal


def test_drain_watch_latches_once_serve_starts_stopping_the_replica():
    answers = iter([False, None, True, False])
    watch = DrainWatch(lambda: next(answers))
    assert [watch.draining, watch.draining, watch.draining, watch.draining] == [False, False, True, True]
    assert watch.since is not None


def test_outside_a_replica_nothing_is_draining():
    assert serve_replica_stopping() in (None, False)
    assert DrainWatch().draining is False


def test_the_draining_status_is_what_the_device_recognises():
    error = draining_error()
    assert is_draining_error(error) and error.code == grpc.StatusCode.UNAVAILABLE and error.details == DRAINING_MESSAGE

    class Rpc(grpc.RpcError):
        def code(self):
            return error.code

        def details(self):
            return error.details

    assert is_draining_refusal(Rpc())
    assert not is_draining_error(RuntimeError(DRAINING_MESSAGE))


def test_autoscaling_targets_three_quarters_of_max_sessions_within_a_batch(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    model = str(tmp_path)
    assert target_ongoing_requests(32, 32) == 24.0
    assert target_ongoing_requests(256, 64) == 64.0  # past a batch, per-session latency steps up
    assert target_ongoing_requests(1, 8) == 1.0
    options = DeploymentOptions(autoscaling_config={"min_replicas": 2, "max_replicas": 8})
    policy = options.autoscaling(VerifierConfig(model=model, max_sessions=64, max_batch_size=32))
    assert policy["target_ongoing_requests"] == 32.0 and policy["min_replicas"] == 2 and policy["max_replicas"] == 8
    assert "downscale_delay_s" in policy and "upscale_delay_s" in policy
    given = DeploymentOptions(autoscaling_config={"max_replicas": 4, "target_ongoing_requests": 5})
    assert given.autoscaling(VerifierConfig(model=model))["target_ongoing_requests"] == 5
    assert DeploymentOptions(num_replicas=3).autoscaling(VerifierConfig(model=model)) is None
    assert given.replicas == "1-4 (autoscaling)" and DeploymentOptions().replicas == "1"


def test_autoscaling_options_are_checked():
    with pytest.raises(ValueError, match="not both"):
        DeploymentOptions(num_replicas=2, autoscaling_config={"max_replicas": 4})
    with pytest.raises(ValueError, match="unknown autoscaling_config key"):
        DeploymentOptions(autoscaling_config={"max_replica": 4})
    with pytest.raises(ValueError, match="graceful"):
        DeploymentOptions(graceful_shutdown_wait_loop_s=0)


def test_serve_autoscale_flag():
    from edgespec.cli.serve import _autoscale

    assert _autoscale("1:4") == {"min_replicas": 1, "max_replicas": 4}
    assert _autoscale(None) is None
    for bad in ("4", "a:b", "3:2", "0:0"):
        with pytest.raises(ValueError, match="--autoscale"):
            _autoscale(bad)
