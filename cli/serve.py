"""``edgespec serve``: run the verifier on Ray Serve behind its gRPC ingress.

Starts a local Ray instance (or joins the cluster at --address / RAY_ADDRESS), deploys the
verifier, prints where devices connect, and serves until interrupted.

Exposure: without API keys the gRPC listener binds loopback only; binding another interface
needs keys (--api-keys) or --allow-unauthenticated. With --tls-cert/--tls-key an HAProxy
terminates TLS on --host:--tls-port and the plaintext ingress stays on loopback.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import signal
import sys
import threading
from pathlib import Path

import ray  # noqa: F401  (fail early, with the CLI's "install the cloud extra" hint)

from edgespec.cloud.serving.app import DEFAULT_GRPC_PORT, init_ray, serve_verifier
from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig, model_max_context
from edgespec.cloud.serving.ingress import DEFAULT_INGRESS, INGRESSES
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
    "api_keys_file": str,
    "api_keys_env": str,
}
FLAG_NAMES = {"api_keys_file": "--api-keys", "api_keys_env": "--api-keys-env"}
DEFAULT_TLS_PORT = 9443


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local Hugging Face causal-LM directory (the target)")
    parser.add_argument("--config", type=Path, help="YAML or JSON file of verifier settings (flags override it)")
    parser.add_argument("--num-replicas", type=int, default=None, help="a fixed number of replicas (default 1)")
    parser.add_argument("--autoscale", metavar="MIN:MAX", default=None,
                        help="let Serve's autoscaling keep MIN..MAX replicas on the sessions' load "
                             "(target_ongoing_requests = min(0.75 * max_sessions, max_batch_size))")
    parser.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (0 = CPU)")
    parser.add_argument("--num-cpus", type=float, default=1.0, help="CPUs reserved per replica")
    parser.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    parser.add_argument("--http-port", type=int, default=8000, help="Serve's HTTP port (unused by edgespec)")
    parser.add_argument("--ingress", choices=INGRESSES, default=DEFAULT_INGRESS,
                        help="Serve's gRPC ingress for a local Ray (default %(default)s; see cloud/serving/ingress.py)")
    parser.add_argument("--host", default=None,
                        help="interface devices connect on (default: 0.0.0.0 with API keys, else 127.0.0.1)")
    parser.add_argument("--allow-unauthenticated", action="store_true",
                        help="serve a non-loopback --host without API keys (anyone who can reach it may use it)")
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate chain: terminate TLS (HAProxy) on --host:--tls-port")
    parser.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    parser.add_argument("--tls-port", type=int, default=DEFAULT_TLS_PORT)
    parser.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the deployment to run")
    for name, kind in CONFIG_FLAGS.items():
        parser.add_argument(FLAG_NAMES.get(name, "--" + name.replace("_", "-")), dest=name, type=kind, default=None)
    parser.add_argument("--detach", action="store_true", help="return once deployed (the Ray cluster keeps serving)")


def config_from_args(args: argparse.Namespace) -> VerifierConfig:
    values: dict = load_settings(args.config) if args.config else {}
    values["model"] = args.model
    for name in CONFIG_FLAGS:
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    if getattr(args, "allow_unauthenticated", False):
        values["allow_unauthenticated"] = True
    return VerifierConfig.from_dict(values, source=str(args.config or "edgespec serve"))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure(args: argparse.Namespace, config: VerifierConfig) -> tuple[str, str]:
    """(the host devices connect on, the host the plaintext ingress binds); refuses an exposed,
    unauthenticated listener unless asked for explicitly."""
    keyed = bool(config.api_keys_file or config.api_keys_env)
    host = args.host or ("0.0.0.0" if keyed else "127.0.0.1")
    if not is_loopback(host) and not keyed and not args.allow_unauthenticated:
        raise ValueError(
            f"--host {host} without API keys would let anyone who reaches it use the verifier: configure keys "
            "(--api-keys FILE, see `edgespec keys new`) or pass --allow-unauthenticated"
        )
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    return host, ("127.0.0.1" if args.tls_cert else host)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        config = config_from_args(args)
        options = DeploymentOptions(num_replicas=args.num_replicas, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
                                    autoscaling_config=_autoscale(args.autoscale))
        host, ingress_host = exposure(args, config)
    except ValueError as exc:
        print(f"edgespec serve: {exc}", file=sys.stderr)
        return 2
    if not args.address and config.device in ("cuda", "auto") and args.num_gpus == 0:
        config = dataclasses.replace(config, device="cpu")
    # The transport refuses larger messages before anything parses them (read at Ray's start).
    os.environ.setdefault("RAY_SERVE_GRPC_MAX_MESSAGE_SIZE", str(config.message_cap(model_max_context(config))))
    init_ray(args.address, ingress=args.ingress)
    terminator = None
    try:
        address = serve_verifier(
            config, options, grpc_port=args.grpc_port, http_port=args.http_port, host=ingress_host,
            timeout_s=args.timeout, progress=lambda message: print(message, flush=True),
        )
        if args.tls_cert:
            from edgespec.cloud.serving.tls import TlsTerminator

            terminator = TlsTerminator(args.tls_cert, args.tls_key, upstream=address, listen_port=args.tls_port,
                                       listen_host=host).start()
    except (TimeoutError, RuntimeError, FileNotFoundError) as exc:
        print(f"edgespec serve: {exc}", file=sys.stderr)
        return 1
    where = f"TLS on {host}:{args.tls_port} (plaintext ingress {address}, loopback)" if terminator else f"{host}:{args.grpc_port}"
    auth = "API keys required" if config.api_keys_file or config.api_keys_env else "NO API keys: loopback only" if is_loopback(host) \
        else "NO API keys (--allow-unauthenticated)"
    print(f"edgespec: serving {config.model_id} on gRPC {where}; {auth} (Ctrl-C to stop)", flush=True)
    if args.detach:
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    if terminator is not None:
        terminator.stop()
    from ray import serve

    serve.shutdown()
    return 0


def _autoscale(value: str | None) -> dict | None:
    """``MIN:MAX`` -> Serve's autoscaling bounds (ValueError names the form)."""
    if value is None:
        return None
    try:
        low, high = (int(part) for part in value.split(":"))
    except ValueError:
        raise ValueError(f"--autoscale {value!r}: give MIN:MAX replicas, e.g. 1:4") from None
    if not 0 <= low <= high or high < 1:
        raise ValueError(f"--autoscale {value!r}: need 0 <= MIN <= MAX and MAX >= 1")
    return {"min_replicas": low, "max_replicas": high}
