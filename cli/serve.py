"""``edgespec serve``: run the verifier on Ray Serve behind its gRPC proxy.

Starts a local Ray instance, or joins the cluster at --address / RAY_ADDRESS, deploys the
verifier, prints where it listens, and serves until interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from pathlib import Path

import ray  # noqa: F401  (fail early, with the CLI's "install the cloud extra" hint)

from edgespec.cloud.serving.app import DEFAULT_GRPC_PORT, init_ray, serve_verifier
from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig
from edgespec.edge.settings import load_settings

# CLI flag -> VerifierConfig field, for the knobs worth a flag; --config sets any field.
CONFIG_FLAGS = {
    "max_k": int,
    "max_context": int,
    "max_new_tokens": int,
    "max_sessions": int,
    "max_batch_size": int,
    "batch_wait_timeout_s": float,
    "torch_threads": int,
    "dtype": str,
    "device": str,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local Hugging Face causal-LM directory (the target)")
    parser.add_argument("--config", type=Path, help="YAML or JSON file of verifier settings (flags override it)")
    parser.add_argument("--num-replicas", type=int, default=1)
    parser.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (0 = CPU)")
    parser.add_argument("--num-cpus", type=float, default=1.0, help="CPUs reserved per replica")
    parser.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    parser.add_argument("--http-port", type=int, default=8000, help="Serve's HTTP proxy port (unused by edgespec)")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the deployment to run")
    for name, kind in CONFIG_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    parser.add_argument("--detach", action="store_true", help="return once deployed (the Ray cluster keeps serving)")


def config_from_args(args: argparse.Namespace) -> VerifierConfig:
    values: dict = load_settings(args.config) if args.config else {}
    values["model"] = args.model
    for name in CONFIG_FLAGS:
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    return VerifierConfig.from_dict(values, source=str(args.config or "edgespec serve"))


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        config = config_from_args(args)
        options = DeploymentOptions(num_replicas=args.num_replicas, num_cpus=args.num_cpus, num_gpus=args.num_gpus)
    except ValueError as exc:
        print(f"edgespec serve: {exc}", file=sys.stderr)
        return 2
    if not args.address and config.device in ("cuda", "auto") and args.num_gpus == 0:
        config = dataclasses.replace(config, device="cpu")
    init_ray(args.address)
    try:
        serve_verifier(
            config,
            options,
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            timeout_s=args.timeout,
            progress=lambda message: print(message, flush=True),
        )
    except (TimeoutError, RuntimeError) as exc:
        print(f"edgespec serve: {exc}", file=sys.stderr)
        return 1
    print(f"edgespec: serving {config.model_id} on gRPC port {args.grpc_port} (Ctrl-C to stop)", flush=True)
    if args.detach:
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    from ray import serve

    serve.shutdown()
    return 0
