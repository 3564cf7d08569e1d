"""cluster/: the `ray up` configs pass Ray's schema, the Serve configs build the application, and
the production layout exposes nothing but TLS."""

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
    if "api_keys_file" in args:
        keys = tmp_path / "keys.yaml"
        keys.write_text("keys: []\n")
        args["api_keys_file"] = str(keys)
    assert build(args) is not None
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \[.max_batchsize.\] for VerifierConfig"):
        build({**args, "max_batchsize": 3})


def test_the_production_layout_exposes_only_tls():
    cluster = yaml.safe_load((REPO / "cluster" / "ray-cluster.yaml").read_text())
    (rule,) = cluster["provider"]["security_group"]["IpPermissions"]
    assert (rule["FromPort"], rule["ToPort"]) == (443, 443)
    head = " ".join(cluster["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "RAY_SERVE_ENABLE_HA_PROXY=1" in head
    assert "RAY_SERVE_ENABLE_HA_PROXY=1" in " ".join(cluster["worker_start_ray_commands"])
    serve = yaml.safe_load((REPO / "cluster" / "serve.yaml").read_text())
    assert serve["http_options"]["host"] == "127.0.0.1"  # the ingress listens on loopback, behind TLS
    assert serve["applications"][0]["args"]["api_keys_file"]
    assert serve["grpc_options"]["enable_reflection"] is False


def test_the_tls_terminator_config_is_the_one_edgespec_serve_runs(tmp_path):
    import subprocess

    from edgespec.cloud.serving.tls import haproxy_binary, render_config

    text = (REPO / "cluster" / "haproxy-tls.cfg").read_text()
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#") or line.startswith("    #"))
    assert body == render_config(listen="*:443", pem="/etc/haproxy/certs/edgespec.pem", upstream="127.0.0.1:9000")
    from helpers.tls import make_ca_and_server_cert

    certs = make_ca_and_server_cert(tmp_path)
    pem = tmp_path / "server.pem"
    pem.write_bytes(certs["cert"].read_bytes() + certs["key"].read_bytes())
    config = tmp_path / "haproxy.cfg"
    config.write_text(text.replace("/etc/haproxy/certs/edgespec.pem", str(pem)))  # checked, not started
    check = subprocess.run([haproxy_binary(), "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_serve_yaml_places_replicas_under_deployments_as_print_config_writes_them(tmp_path):
    """Replica count, autoscaling and resources live in Serve's `deployments:` override (a change
    there is applied in place), never under `args` (a change there replaces every replica); and
    the override is exactly what `edgespec serve --print-config` writes for the same settings."""
    from edgespec.cloud.serving.app import deployment_override
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig

    (app,) = yaml.safe_load((REPO / "cluster" / "serve.yaml").read_text())["applications"]
    assert not {"num_replicas", "autoscaling_config", "num_gpus", "num_cpus"} & set(app["args"])
    (override,) = app["deployments"]
    (tmp_path / "config.json").write_text("{}")
    config = VerifierConfig.from_dict({**app["args"], "model": str(tmp_path), "api_keys_file": ""})
    actor = override["ray_actor_options"]
    options = DeploymentOptions(num_cpus=actor["num_cpus"], num_gpus=actor["num_gpus"],
                                autoscaling_config=override["autoscaling_config"],
                                graceful_shutdown_timeout_s=override["graceful_shutdown_timeout_s"])
    assert deployment_override(config, options) == override


def test_print_config_is_a_serve_deploy_config(tmp_path, capsys):
    import argparse

    from ray.serve.schema import ServeDeploySchema

    from edgespec.cli import serve as serve_cli

    (tmp_path / "config.json").write_text("{}")
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args(["--model", str(tmp_path), "--autoscale", "1:4", "--num-gpus", "1", "--max-sessions", "8",
                              "--grpc-port", "9100", "--print-config"])
    assert serve_cli.run(args) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    ServeDeploySchema.model_validate(config)
    (app,) = config["applications"]
    assert app["args"] == {"model": str(tmp_path), "max_sessions": 8}
    (override,) = app["deployments"]
    assert override["autoscaling_config"]["max_replicas"] == 4 and override["ray_actor_options"]["num_gpus"] == 1
    assert override["max_ongoing_requests"] == 8 + 64 + 16 and config["grpc_options"]["port"] == 9100
