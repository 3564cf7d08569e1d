"""cluster/: the `ray up` configs pass Ray's schema and the Serve configs build the application."""

from __future__ import annotations

import pytest
import yaml
from helpers import REPO


@pytest.mark.parametrize("name", ["ray-cluster.yaml", "fake-cluster.yaml"])
def test_cluster_configs_pass_rays_schema(name):
    from ray.autoscaler._private.util import validate_config

    validate_config(yaml.safe_load((REPO / "cluster" / name).read_text()))


@pytest.mark.parametrize("name", ["serve.yaml", "serve-local.yaml", "serve-fake-gpu.yaml"])
def test_serve_configs_build_the_application(name, tmp_path):
    from ray.serve.schema import ServeDeploySchema

    from edgespec.cloud.serving.app import GRPC_SERVICER_FUNCTIONS, build

    config = yaml.safe_load((REPO / "cluster" / name).read_text())
    ServeDeploySchema.model_validate(config)  # what `serve deploy` checks first
    assert config["grpc_options"]["grpc_servicer_functions"] == GRPC_SERVICER_FUNCTIONS
    (app,) = config["applications"]
    (tmp_path / "config.json").write_text("{}")  # a model directory as far as the config can tell
    args = {**app["args"], "model": str(tmp_path)}
    assert build(args) is not None
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \[.max_batchsize.\] for VerifierConfig"):
        build({**args, "max_batchsize": 3})
