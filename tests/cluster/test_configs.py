"""cluster/: the `ray up` configs pass Ray's schema, the Serve configs build the application, and
the production layout exposes nothing but TLS."""

from __future__ import annotations

import pytest
import yaml
from helpers import REPO


@pytest.mark.parametrize("name", ["ray-cluster.yaml", "ray-cluster-70b.yaml", "fake-cluster.yaml"])
def test_cluster_configs_pass_rays_schema(name):
    from ray.autoscaler._private.util import validate_config

    validate_config(yaml.safe_load((REPO / "cluster" / name).read_text()))


@pytest.mark.parametrize("name", ["serve.yaml", "serve-local.yaml", "serve-fake-gpu.yaml", "serve-70b.yaml", "serve-70b-pp.yaml"])
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
    rules = cluster["provider"]["security_group"]["IpPermissions"]
    assert [(rule["FromPort"], rule["ToPort"]) for rule in rules] == [(443, 443), (8443, 8443)]  # gRPC, wss
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
    assert body == render_config(listen="*:443", pem="/etc/haproxy/certs/edgespec.pem", upstream="127.0.0.1:9000",
                                 http_listen="*:8443", http_upstream="127.0.0.1:8000")
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


# ---- the 70B layout: ray-cluster-70b.yaml with serve-70b.yaml (TP 8) or serve-70b-pp.yaml (TP 8 x PP 2)

SERVE_70B = ["serve-70b.yaml", "serve-70b-pp.yaml"]


def header_command(text: str) -> list[str]:
    """The `edgespec serve --print-config ...` command a config's header says wrote it."""
    import shlex

    lines = [line.removeprefix("#").strip() for line in text.splitlines() if line.startswith("#")]
    start = next(i for i, line in enumerate(lines) if line.startswith("edgespec serve --print-config"))
    command = []
    for line in lines[start:]:
        command.append(line.removesuffix("\\"))
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(command))[2:]  # the flags, after `edgespec serve`


@pytest.mark.parametrize("name", SERVE_70B)
def test_the_70b_configs_are_what_print_config_writes(name, tmp_path, capsys):
    """The command in the file's header, run with local stand-ins for the model and key paths,
    prints the file (the autoscaling policy aside: the file sets its delays by hand), the
    placement-group bundles and the replica's resources included; and the file's `deployments:`
    entry is what edgespec derives for its own args and resources, autoscaling included."""
    import argparse
    import json

    from edgespec.cli import serve as serve_cli
    from edgespec.cloud.serving.app import deployment_override
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig

    text = (REPO / "cluster" / name).read_text()
    config = yaml.safe_load(text)
    (app,) = config["applications"]
    flags = header_command(text)
    model, keys = tmp_path / "target-70b", tmp_path / "edgespec-keys.yaml"
    model.mkdir()
    (model / "config.json").write_text("{}")
    keys.write_text("keys: []\n")
    engine = tmp_path / "engine-70b.json"
    engine.write_text(json.dumps({"engine_args": app["args"]["engine_args"]}))
    local = {app["args"]["model"]: str(model), app["args"]["api_keys_file"]: str(keys), "engine-70b.json": str(engine)}
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    assert serve_cli.run(parser.parse_args([local.get(flag, flag) for flag in flags])) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    (printed_app,) = printed.pop("applications")
    assert printed == {key: value for key, value in config.items() if key != "applications"}
    assert printed_app["args"] == {**app["args"], "model": str(model), "api_keys_file": str(keys)}
    (printed_override,) = printed_app["deployments"]
    (override,) = app["deployments"]
    assert {k: v for k, v in printed_override.items() if k not in ("num_replicas", "autoscaling_config")} == \
        {k: v for k, v in override.items() if k != "autoscaling_config"}

    verifier = VerifierConfig.from_dict({**app["args"], "model": str(model), "api_keys_file": ""})
    actor = override["ray_actor_options"]
    options = DeploymentOptions(num_cpus=actor["num_cpus"], num_gpus=actor["num_gpus"],
                                autoscaling_config=override["autoscaling_config"],
                                graceful_shutdown_timeout_s=override["graceful_shutdown_timeout_s"])
    assert deployment_override(verifier, options) == override
    assert app["args"]["backend"] == "vllm" and actor["num_gpus"] == 0  # vLLM's workers hold the bundles' GPUs
    assert sum(bundle.get("GPU", 0) for bundle in override["placement_group_bundles"]) == verifier.gpus_per_replica
    assert not {"num_replicas", "autoscaling_config", "num_gpus", "num_cpus"} & set(app["args"])


@pytest.mark.parametrize("name", SERVE_70B)
def test_the_70b_replicas_fit_the_70b_cluster(name):
    """A replica's bundles fit the worker type of ray-cluster-70b.yaml (STRICT_PACK: on one node;
    PACK: on whole nodes), and max_replicas of them fit max_workers nodes."""
    import math

    cluster = yaml.safe_load((REPO / "cluster" / "ray-cluster-70b.yaml").read_text())
    (worker,) = [node for key, node in cluster["available_node_types"].items() if key != cluster["head_node_type"]]
    (app,) = yaml.safe_load((REPO / "cluster" / name).read_text())["applications"]
    (override,) = app["deployments"]
    bundles = override["placement_group_bundles"]
    gpus = sum(bundle.get("GPU", 0) for bundle in bundles)
    assert all(bundle.get("CPU", 0) <= worker["resources"]["CPU"] for bundle in bundles)
    if override["placement_group_strategy"] == "STRICT_PACK":
        assert gpus <= worker["resources"]["GPU"]
        nodes = 1
    else:
        # one pipeline stage a node, each stage's tensor-parallel group filling it
        assert app["args"]["tensor_parallel_size"] == worker["resources"]["GPU"]
        nodes = math.ceil(gpus / worker["resources"]["GPU"])
    assert override["autoscaling_config"]["max_replicas"] * nodes <= worker["max_workers"] <= cluster["max_workers"]
    assert override["autoscaling_config"]["min_replicas"] >= 1


def test_the_70b_cluster_runs_the_same_commands_as_the_rehearsed_one():
    """ray-cluster-70b.yaml's commands are ray-cluster.yaml's (which scripts/rehearse_ray_up.sh
    runs, test_rehearsal.py) but for the wheel's extra: vllm instead of cloud. Its security group
    is the same TLS-only one, and every path serve-70b*.yaml names is one of its file mounts."""
    base = yaml.safe_load((REPO / "cluster" / "ray-cluster.yaml").read_text())
    big = yaml.safe_load((REPO / "cluster" / "ray-cluster-70b.yaml").read_text())
    for section in ("head_setup_commands", "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands"):
        assert big[section] == base[section], section
    assert [c.replace("[vllm]", "[cloud]") for c in big["setup_commands"]] == base["setup_commands"]
    assert big["provider"]["security_group"] == base["provider"]["security_group"]
    for name in SERVE_70B:
        serve = yaml.safe_load((REPO / "cluster" / name).read_text())
        assert serve["http_options"]["host"] == "127.0.0.1" and serve["grpc_options"]["enable_reflection"] is False
        args = serve["applications"][0]["args"]
        for path in (args["model"], args["api_keys_file"]):
            assert any(path == mount or path.startswith(mount + "/") for mount in big["file_mounts"]), path
